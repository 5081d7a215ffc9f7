"""A just-launched run reads "starting" until it is really waiting for a free slot (issue 13, 2).

The train process keeps a new run 'queued' in the store until it has imported torch and
Lightning, loaded the data and claimed a slot. The pages show it as "starting" while a
slot is free for it, and "waiting for a free slot" only when the running runs (and the
queued runs launched before it) take every slot. Torch-free: fake runs, AppTest.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from streamlit.testing.v1 import AppTest

from blockviz import cli
from blockviz.core import spec
from blockviz.dashboard import tables, ui
from blockviz.dashboard.live.header import STATUS_COLORS
from blockviz.launch import runner
from blockviz.store import RunStore, default_store_path
from tests import fakes
from tests.helpers import ROOT, texts

APP = str(ROOT / "app.py")
TIMEOUT = 30


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[RunStore]:
    """The app's store, with one training slot whatever the machine has."""
    monkeypatch.setenv("BLOCKVIZ_MAX_RUNNING", "1")
    run_store = RunStore(default_store_path())
    yield run_store
    run_store.close()


def _add(store: RunStore, status: str, name: str) -> int:
    config = fakes.fake_config()
    return fakes.add_run(store, config, status, name=name)


def _progress_texts(at: AppTest) -> list[str]:
    return [str(bar.proto.text) for bar in at.get("progress")]


def _badges(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "-badge[" in m.value]


def test_a_queued_run_is_starting_while_a_slot_is_free_and_waiting_when_none_is(
    store: RunStore,
) -> None:
    first = _add(store, "queued", "first")
    second = _add(store, "queued", "second")
    # No run is running: the older queued run gets the free slot, the newer one waits.
    assert runner.shown_statuses(store) == {first: spec.STARTING, second: "queued"}
    assert runner.shown_statuses(store, max_running=2) == {
        first: spec.STARTING,
        second: spec.STARTING,
    }
    assert runner.shown_statuses(store, max_running=0)[second] == spec.STARTING  # no limit
    running = _add(store, "running", "busy")
    shown = runner.shown_statuses(store)
    assert shown == {first: "queued", second: "queued", running: "running"}
    active = {run.id: run for run in runner.active(store)}
    assert active[first].waiting and active[running].shown == "running"
    assert active[first].label == f"queued · {spec.WAITING_FOR_SLOT}"
    assert runner.active(store, max_running=3)[0].label == spec.STARTING
    assert not runner.active(store, max_running=3)[0].waiting


def test_train_progress_says_starting_with_a_free_slot(store: RunStore) -> None:
    queued = _add(store, "queued", "fresh")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    [text] = _progress_texts(at)
    assert text.startswith(f"#{queued} fresh · {spec.STARTING}")
    assert spec.WAITING_FOR_SLOT not in text


def test_train_progress_says_waiting_when_every_slot_is_taken(store: RunStore) -> None:
    _add(store, "running", "busy")
    queued = _add(store, "queued", "later")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    waiting = [t for t in _progress_texts(at) if t.startswith(f"#{queued} ")]
    assert waiting == [f"#{queued} later · queued · {spec.WAITING_FOR_SLOT}"]


def test_runs_table_shows_starting_and_queued(store: RunStore) -> None:
    first = _add(store, "queued", "first")
    second = _add(store, "queued", "second")
    table = tables.runs_table(store.runs_frame(), now=0.0)
    assert dict(zip(table["id"], table["status"], strict=True)) == {
        first: spec.STARTING,
        second: "queued",
    }
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    [frame] = at.dataframe
    shown = dict(zip(frame.value["id"], frame.value["status"], strict=True))
    assert shown == {first: spec.STARTING, second: "queued"}


@pytest.mark.parametrize("busy", [False, True])
def test_live_header_says_starting_or_waiting(store: RunStore, busy: bool) -> None:
    if busy:
        _add(store, "running", "busy")
    queued = _add(store, "queued", "watched")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[ui.RUN_KEY] = queued
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception
    badges = _badges(at)
    infos = texts(at, "info")
    if busy:
        assert badges == [":gray-badge[queued]"]
        assert spec.WAITING_FOR_SLOT in infos
    else:
        assert badges == [f":blue-badge[{spec.STARTING}]"]
        assert "Starting" in infos and spec.WAITING_FOR_SLOT not in infos


def test_live_watches_for_the_first_loss_then_reruns_once(store: RunStore) -> None:
    # Launch to first point: Live looks every FIRST_POINT_REFRESH_S until an active run's
    # first loss arrives, then reruns once at the ordinary refresh, never in a loop.
    run = _add(store, "running", "fresh")
    store.truncate_after(run, -1)  # nothing logged yet
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[ui.RUN_KEY] = run
    at.session_state["live.first_point_seen"] = set()
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception
    assert run not in at.session_state["live.first_point_seen"]
    store.log_scalars(run, [(0, "train/loss", 3.5)])
    store.flush()
    at.run()
    assert not at.exception
    assert run in at.session_state["live.first_point_seen"]
    # A latest loss that is not finite (read as missing by the runs list) cannot loop.
    store.log_scalars(run, [(1, "train/loss", float("nan"))])
    store.flush()
    at.session_state["live.first_point_seen"] = set()
    at.run()
    assert not at.exception
    assert run in at.session_state["live.first_point_seen"]


@pytest.mark.parametrize("busy", [False, True])
def test_every_surface_words_a_queued_run_alike(
    store: RunStore, busy: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35, 9: one word for one state in Live's picker and header, Compare's picker,
    the Runs table and the CLI's `runs` and `show` (the picker said "(queued)" while the
    header said "starting")."""
    if busy:
        _add(store, "running", "busy")
    queued = _add(store, "queued", "watched")
    word = "queued" if busy else spec.STARTING
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[ui.RUN_KEY] = queued
    at.session_state[ui.COMPARE_KEY] = [queued]
    at.run()
    at.switch_page("pages/live.py").run()
    assert not at.exception
    assert at.sidebar.selectbox(key="live.run").options[-1] == f"#{queued} watched ({word})"
    assert _badges(at) == [f":{'gray' if busy else 'blue'}-badge[{word}]"]
    at.switch_page("pages/compare.py").run()
    assert f"#{queued} watched ({word})" in at.multiselect(key="compare.runs").options
    at.switch_page("pages/runs.py").run()
    [frame] = at.dataframe
    assert dict(zip(frame.value["id"], frame.value["status"], strict=True))[queued] == word
    assert cli.main(["runs", "--store", str(store.location.text)]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert next(cells for cells in listed if cells[0] == str(queued))[2] == word
    assert cli.main(["show", str(queued), "--store", str(store.location.text)]) == 0
    status = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("status"))
    assert status.split()[1] == word


def test_one_table_words_every_state_and_the_header_colours_each() -> None:
    assert set(spec.RUN_STATES) == {*spec.STATUSES, spec.STARTING}
    assert set(STATUS_COLORS) == set(spec.RUN_STATES)
    pages = (ROOT / "docs" / "pages.md").read_text(encoding="utf-8")
    for word, meaning in spec.RUN_STATES.items():
        assert f"| `{word}` | {meaning} |" in pages, word
