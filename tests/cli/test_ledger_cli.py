"""`blockviz ledger list|show|export|import` on constructed studies: what each prints, the
files it writes, and one line with exit status 2 for every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockviz.cli import main
from blockviz.core import ledger as ldg
from blockviz.store import RunStore
from blockviz.views.ledger import page
from tests.helpers import fake_study


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    path = tmp_path / "here.db"
    with RunStore(path) as store:
        fake_study(store, "sublayers")
    return str(path)


def _run(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    code = main(list(words))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_prints_a_line_per_claim_with_each_set_and_the_replication(
    store_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "ledger", "list", "--store", store_path)
    assert code == 0
    lines = out.splitlines()
    (sublayers,) = [line for line in lines if line.startswith("sublayers-1 ")]
    assert "quick: seeds 1–2 " in sublayers and "→ no second set" in sublayers
    assert sublayers.endswith("Attention alone trains to a higher loss than the full block.")
    (norm,) = [line for line in lines if line.startswith("norm-position-1 ")]
    assert " not run " in norm
    code, out, _ = _run(capsys, "ledger", "list", "--json", "--store", store_path)
    assert [e["id"] for e in json.loads(out)][:2] == ["norm-position-1", "norm-position-2"]


def test_show_prints_the_card_of_an_id_or_of_words(
    store_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "ledger", "show", "ffn alone", "--store", store_path)
    assert code == 0
    assert out.startswith("sublayers-2: The FFN alone")
    assert "seeds 1–2 (study 1), " in out and "intervals: attention + FFN minus FFN only" in out
    assert "study run sublayers --size quick --seeds 3-" in out and f"--store {store_path}`" in out
    code, out, _ = _run(capsys, "ledger", "show", "norm-position-1", "--store", store_path)
    assert "not run: `.venv/bin/python -m blockviz study run norm-position --size quick " in out


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (("show", "loss"), "'loss' matches"),
        (("show", "no such words"), "no claim 'no such words'"),
        (("export",), "say what to write: --html FILE, --json FILE or both"),
        (("export", "--json", "/nonexistent/dir/x.json"), "cannot write /nonexistent/dir/x.json"),
        (("import", "/nonexistent.json"), "/nonexistent.json: no such file"),
    ],
)
def test_a_bad_request_is_one_line_and_exit_status_2(
    store_path: str, capsys: pytest.CaptureFixture[str], words: tuple[str, ...], said: str
) -> None:
    code, out, err = _run(capsys, "ledger", *words, "--store", store_path)
    assert code == 2 and out == ""
    assert err.startswith("blockviz ledger: error: ") and said in err
    assert err.count("\n") == 1


def test_export_then_import_elsewhere_keeps_the_origin_and_adds_nothing_twice(
    store_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(page, "vega_bundle", lambda: "/* bundle */")
    exported, html = tmp_path / "l.json", tmp_path / "l.html"
    code, out, _ = _run(
        capsys, "ledger", "export", "--json", str(exported), "--html", str(html),
        "--store", store_path,
    )  # fmt: skip
    assert code == 0 and f"wrote {exported}" in out and f"wrote {html}" in out
    assert "class='card'" in html.read_text(encoding="utf-8")
    other = tmp_path / "other.db"
    RunStore(other).close()
    code, out, _ = _run(capsys, "ledger", "import", str(exported), "--store", str(other))
    assert code == 0
    assert "imported 2 measurement(s) of " in out and f"from {store_path} on " in out
    code, out, _ = _run(capsys, "ledger", "import", str(exported), "--store", str(other))
    assert code == 0 and "was imported already" in out and "nothing added" in out
    code, out, _ = _run(capsys, "ledger", "show", "sublayers-1", "--store", str(other))
    assert f"measured at size quick in {store_path} on " in out


def test_a_hostile_import_is_one_line_and_keeps_nothing(
    store_path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = tmp_path / "hostile.json"
    document = {
        "format": ldg.FORMAT,
        "version": ldg.VERSION,
        "exported": "now",
        "origin": {"host": "h", "store": "s"},
        "entries": [{"id": ["not", "text"]}],
    }
    hostile.write_text(json.dumps(document), encoding="utf-8")
    code, out, err = _run(capsys, "ledger", "import", str(hostile), "--store", store_path)
    assert code == 2 and out == ""
    assert err == (
        f"blockviz ledger: error: {hostile} is not a ledger export blockviz reads: "
        "entries[0].id: expected text\n"
    )
    assert not (Path(store_path).parent / "here.db.ledger").exists()
