"""AppTest of the Ledger page: every claim as a card, a measured one with its verdicts and
re-run command, the downloads, and the import uploader (the CLI's checks)."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from blockviz.core import ledger as ldg
from blockviz.core.studies import builtins
from blockviz.store import RunStore
from blockviz.views.ledger import build
from tests.helpers import fake_study

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "pages" / "ledger.py"
CLAIMS = sum(len(make().claims) for make in builtins.BUILTINS.values())


def _page() -> AppTest:
    return AppTest.from_file(str(PAGE), default_timeout=60)


def _text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += [e.value for e in at.error] + [i.value for i in at.info]
    parts += [s.value for s in at.success]
    return "\n".join(str(p) for p in parts).replace("\\", "")


def test_an_empty_store_shows_every_claim_not_run_with_the_command_that_runs_it() -> None:
    at = _page().run()
    assert not at.exception
    text = _text(at)
    assert f"{CLAIMS} claims, 0 measured" in text
    assert text.count("Not run.") == CLAIMS
    commands = [c.value for c in at.code]
    assert any("study run qk-norm-z-loss --size quick" in c for c in commands)
    assert "Without residual connections, deep stacks fail to train." in text


def test_a_measured_claim_shows_each_seed_set_and_its_rerun(tmp_path: Path) -> None:
    with RunStore() as store:
        fake_study(store, "sublayers")
        fake_study(store, "sublayers", seeds="3-4")
    at = _page().run()
    assert not at.exception
    text = _text(at)
    assert f"{CLAIMS} claims, 2 measured" in text
    assert "seeds 1–2 (study 1): **" in text and "seeds 3–4 (study 2): **" in text
    assert "Replication:" in text and "paired" in text
    assert any("study run sublayers --size quick --seeds 5-" in c.value for c in at.code)
    labels = [b.label for b in at.get("download_button")]
    assert labels == [
        "Download ledger (offline HTML)",
        "Download ledger (JSON, to import elsewhere)",
    ]


def test_an_upload_is_imported_once_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    with RunStore(tmp_path / "elsewhere.db") as other:
        fake_study(other, "tied-embeddings")  # a study of one claim
        data = json.dumps(ldg.to_json(build.ledger(other))).encode()
    at = _page().run()
    at.get("file_uploader")[0].set_value(("peer.json", data, "application/json")).run()
    assert not at.exception
    assert "Imported 1 measurement(s)" in _text(at)
    assert "elsewhere.db on" in _text(at) and f"{CLAIMS} claims, 1 measured" in _text(at)
    with RunStore() as store:
        assert len(list(store.ledger_root.glob("*.json"))) == 1
    at.get("file_uploader")[0].set_value(("bad.json", b'{"format": 1}', "application/json"))
    at.run()
    assert not at.exception
    (error,) = at.error
    said = error.value.replace("\\", "")
    assert "bad.json is not a ledger export blockviz reads: format: expected" in said


def test_a_swept_claim_draws_its_final_loss_against_the_learning_rate() -> None:
    with RunStore() as store:
        fake_study(store, "lr-sensitivity")
    at = _page().run()
    assert not at.exception
    assert len(at.get("vega_lite_chart")) == 2  # both lr-sensitivity claims, none else
    assert "grid 21 variants (lr × norm_position) × each set's seeds" in _text(at)
