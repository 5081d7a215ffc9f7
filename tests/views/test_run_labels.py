"""Tags and notes outside the Runs page: config diff, report, CLI; the tag filter's rule;
when Resume is offered (issue 13, items 11 and 15)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from blockviz import cli
from blockviz.core.config import replace
from blockviz.core.tags import AUTO_TAG
from blockviz.dashboard.tag_filter import all_tags, select_runs
from blockviz.launch import runner
from blockviz.store import RunRecord, RunStore
from blockviz.views.export.report import config_diff_table, report_html
from tests.helpers import tiny_config


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    with RunStore(tmp_path / "runs.db") as run_store:
        yield run_store


def test_config_diff_shows_tags_and_notes_rows_only_where_they_differ(store: RunStore) -> None:
    a = store.create_run("a", tiny_config().to_json(), tags="sweep, pre", notes="baseline")
    b = store.create_run("b", tiny_config().to_json(), tags="sweep", notes="baseline")
    headers, rows = config_diff_table([store.get_run(a), store.get_run(b)])
    assert headers == ["field", "a", "b"]
    assert rows == [["tags", "sweep, pre", "sweep"]]  # identical configs, same notes
    c = store.create_run("c", replace(tiny_config(), lr=7e-4).to_json(), tags="sweep, pre")
    store.set_notes(c, "lower lr")
    _, rows = config_diff_table([store.get_run(a), store.get_run(c)])
    assert [row[0] for row in rows] == ["lr", "notes"]  # config fields first
    assert rows[-1] == ["notes", "baseline", "lower lr"]


def test_report_shows_tags_and_notes_html_escaped(store: RunStore) -> None:
    a = store.create_run(
        "a", tiny_config().to_json(), tags="x:1", notes="<script>alert(1)</script>"
    )
    b = store.create_run("b", tiny_config().to_json(), notes="a & b\nsecond line")
    page = report_html([store.get_run(a), store.get_run(b)], [], pd.DataFrame(), {})
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a &amp; b\nsecond line" in page
    assert "<td>x:1</td>" in page
    # Identical configs still say so, above the rows for tags and notes.
    assert "configurations are identical" in page


def test_cli_show_prints_tags_and_notes_and_runs_lists_tags(
    store: RunStore, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = store.create_run("a", tiny_config().to_json(), tags="sweep, pre")
    store.set_notes(run_id, "first line\nsecond line")
    store.create_run("b", tiny_config().to_json())
    store.flush()
    assert cli.main(["show", "a", "--store", str(store.path)]) == 0
    out = capsys.readouterr().out
    tags_line = next(line for line in out.splitlines() if line.startswith("tags"))
    assert tags_line.split(None, 1)[1] == "sweep, pre"
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("notes"))
    assert lines[first].endswith("first line")
    # The second line of the notes sits under the first, not at the margin.
    assert lines[first + 1].strip() == "second line" and lines[first + 1].startswith(" ")
    assert cli.main(["runs", "--store", str(store.path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-2:] == ["tags", "disk"]
    tags = slice(table[0].index("tags"), table[0].index("disk"))  # the tags column
    assert table[1][tags].strip() == "sweep, pre" and table[2][tags].strip() == "-"


def test_select_runs_needs_every_chosen_tag_and_hides_auto_runs_unless_asked() -> None:
    runs = pd.DataFrame(
        {"id": [1, 2, 3, 4], "tags": ["sweep, pre", "sweep", "", f"{AUTO_TAG}, sweep"]}
    )

    def ids(wanted: list[str], show_auto: bool) -> list[int]:
        return select_runs(runs, wanted, show_auto)["id"].tolist()

    assert ids([], show_auto=False) == [1, 2, 3]
    assert ids([], show_auto=True) == [1, 2, 3, 4]
    assert ids(["sweep"], show_auto=False) == [1, 2]
    assert ids(["sweep", "pre"], show_auto=True) == [1]
    assert ids([AUTO_TAG], show_auto=False) == [4]  # asking for the tag shows them
    assert all_tags(runs) == [AUTO_TAG, "pre", "sweep"]


@pytest.mark.parametrize(
    ("status", "step", "checkpoint", "reason"),
    [
        ("stopped", 5, True, None),
        ("failed", 5, True, None),
        ("failed", 12, True, None),  # killed after its final checkpoint: resume finishes it
        ("stopped", 12, True, None),
        ("running", 5, True, "running"),
        ("queued", 0, True, "queued"),
        ("diverged", 5, True, "diverged"),
        ("stopped", 5, False, "no checkpoint"),
        ("completed", 12, True, "max_steps"),
    ],
)
def test_resume_is_offered_where_train_resume_can_continue(
    status: str, step: int, checkpoint: bool, reason: str | None
) -> None:
    run = RunRecord(id=1, name="r", status=status, step=step, max_steps=12)
    blocker = runner.resume_blocker(run, checkpoint)
    assert blocker is None if reason is None else reason in blocker


def test_resume_of_a_run_that_cannot_continue_is_refused_before_any_process(
    store: RunStore,
) -> None:
    run_id = store.create_run("done", tiny_config().to_json(), status="stopped", max_steps=6)
    with pytest.raises(runner.LaunchError, match="no checkpoint"):
        runner.resume(store, run_id)
    assert store.get_run(run_id).pid is None and store.get_run(run_id).status == "stopped"
