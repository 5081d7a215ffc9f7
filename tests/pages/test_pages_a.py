"""AppTest of the app and the Train, Parameters and Runs pages; no page imports torch."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core.presets import DEFAULT_PRESET, PLAYGROUND_PRESET
from blockviz.dashboard import sidebar, store_access, streamlit_compat, ui
from blockviz.store import RunStore, StoreError, StoreLocked, default_store_path
from tests import fakes
from tests.helpers import select_row, texts
from tests.real_runs import RealRuns, copy_run

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py"))
MY_PAGES = ("pages/train.py", "pages/parameters.py", "pages/runs.py")
CONFIG_PAGES = (  # the pages that draw the config
    "pages/train.py",
    "pages/playground.py",
    "pages/parameters.py",
    "pages/init_grads.py",
)
TIMEOUT = 30
STATUSES = ("completed", "running", "diverged", "failed")


@pytest.fixture
def store() -> Iterator[RunStore]:
    """The store the app will open ($BLOCKVIZ_STORE, a tmp path per test)."""
    run_store = RunStore(default_store_path())
    yield run_store
    run_store.close()


@pytest.fixture
def populated(store: RunStore, real_runs: RealRuns) -> list[int]:
    """A finished real run, then a running, diverged and failed fake one, tiny (STATUSES)."""
    completed = copy_run(store, real_runs.path, real_runs.ids["pre"])
    others = fakes.populate(store, n_runs=3, n_steps=60, n_layer=2, statuses=STATUSES[1:])
    return [completed, *others]


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    if page != "pages/train.py":
        at.switch_page(page).run()
    return at


def opened_by(open_store: Callable[..., RunStore]) -> type[RunStore]:
    """A RunStore class whose opening is `open_store` (a stand-in for the file system).

    `RunStore.open_readable` opens through `cls(...)`; `__new__` hands that to
    `open_store`, whose stores are plain RunStores, so `__init__` is not run again.
    """

    class Opened(RunStore):
        def __new__(cls, path: str | None = None, **options: object) -> RunStore:
            return open_store(path, **options)

    return Opened


def test_pages_render_with_an_empty_store(store: RunStore) -> None:
    for page in MY_PAGES:
        at = open_page(page)
        assert not at.exception, page
        assert not texts(at, "error"), (page, texts(at, "error"))
    assert "No runs yet" in texts(open_page("pages/runs.py"), "info")
    assert "No runs in progress" in texts(open_page("pages/train.py"), "caption")


@pytest.mark.parametrize("page", MY_PAGES)
def test_pages_render_with_finished_running_diverged_and_failed_runs(
    populated: list[int], page: str
) -> None:
    at = open_page(page)
    assert not at.exception
    if page != "pages/runs.py":
        assert not texts(at, "error")


def test_train_page_shows_the_block_parameters_and_progress(populated: list[int]) -> None:
    at = open_page("pages/train.py")
    graphs = at.get("graphviz_chart")
    assert graphs and "digraph block" in graphs[0].proto.spec
    assert {m.label for m in at.metric} >= {"Total", "FFN / block", "Attn / block"}
    assert "FFN holds" in texts(at, "caption")
    running = populated[STATUSES.index("running")]
    bars = at.get("progress")
    assert len(bars) == 1 and f"#{running}" in bars[0].proto.text
    assert at.button(key=f"train.stop.{running}")


@pytest.mark.parametrize(("page", "charts"), [("pages/train.py", 1), ("pages/parameters.py", 2)])
def test_every_chart_offers_four_downloads(page: str, charts: int) -> None:
    from blockviz.dashboard.code_download import LABEL as CODE_LABEL

    at = open_page(page)
    labels = sorted(b.label for b in at.get("download_button") if b.label != CODE_LABEL)
    assert labels == sorted(["PNG", "SVG", "HTML", "CSV"] * charts)
    assert len(at.get("vega_lite_chart")) == charts


def test_download_buttons_build_the_promised_files(monkeypatch: pytest.MonkeyPatch) -> None:
    from blockviz.dashboard.code_download import LABEL as CODE_LABEL

    built: dict[str, object] = {}
    original = ui.st.download_button

    def spy(label: str, data: object, file_name: str | None = None, **kwargs: object) -> bool:
        assert callable(data), "downloads must be built on click, not on every refresh"
        if label != CODE_LABEL:  # the config as code: tests/views/export/test_codegen.py
            built[str(file_name)] = data
        return original(label, data, file_name=file_name, **kwargs)

    monkeypatch.setattr(ui.st, "download_button", spy)
    at = open_page("pages/train.py")
    assert not at.exception
    files = {name.rsplit(".", 1)[1]: make for name, make in built.items()}
    assert set(files) == {"png", "svg", "html", "csv"}
    assert all("/" not in name and name.startswith("parameters-") for name in built)
    assert files["png"]()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in files["svg"]() and "parameters" in files["svg"]()
    assert "vega" in files["html"]().lower()
    assert files["csv"]().splitlines()[0].startswith("component,count,share")


def test_parameters_page_tables_and_share_sentence() -> None:
    at = open_page("pages/parameters.py")
    assert not at.exception
    frames = [df.value for df in at.dataframe]
    by_component = next(f for f in frames if "component" in f.columns and "formula" in f.columns)
    assert {"attn_qkv", "ffn_in", "ffn_out", "lm_head"} <= set(by_component["component"])
    assert by_component["formula"].str.contains("d_model").any()
    total = int(next(m for m in at.metric if m.label == "Total parameters").value.replace(",", ""))
    assert by_component["count"].sum() == total
    assert "FFN holds" in texts(at, "markdown")


def test_runs_page_lists_every_run(populated: list[int]) -> None:
    at = open_page("pages/runs.py")
    assert not at.exception
    table = at.dataframe[0].value
    assert sorted(table["id"]) == sorted(populated)
    assert set(table["status"]) == set(STATUSES)
    failed = populated[STATUSES.index("failed")]
    select_row(at, failed)
    assert "synthetic failure" in texts(at, "error")


def test_runs_page_rename(populated: list[int], store: RunStore) -> None:
    first, second = populated[0], populated[1]
    taken = store.get_run(second).name
    at = open_page("pages/runs.py")
    select_row(at, first)
    at.text_input(key=f"runs.name.{first}").set_value(taken).run()
    at.button(key="runs.rename").click().run()
    assert "already taken" in texts(at, "error")
    at.text_input(key=f"runs.name.{first}").set_value("pre-ln baseline").run()
    at.button(key="runs.rename").click().run()
    assert not at.exception
    assert store.get_run(first).name == "pre-ln baseline"
    assert "pre-ln baseline" in texts(at, "success")


def test_runs_page_delete_needs_confirmation_and_a_stopped_run(
    populated: list[int], store: RunStore
) -> None:
    running = populated[STATUSES.index("running")]
    completed = populated[STATUSES.index("completed")]
    at = open_page("pages/runs.py")
    select_row(at, running)
    # An active run cannot even be confirmed for deletion: both are off, saying why.
    confirm, delete = at.checkbox(key=f"runs.confirm.{running}"), at.button(key="runs.delete")
    assert confirm.disabled and delete.disabled
    assert "stop it first" in confirm.help and "stop it first" in delete.help
    assert store.get_run(running).status == "running"

    select_row(at, completed)
    assert at.button(key="runs.delete").disabled  # not confirmed yet
    at.checkbox(key=f"runs.confirm.{completed}").check().run()
    at.button(key="runs.delete").click().run()
    assert not at.exception
    assert completed not in set(store.runs_frame()["id"])
    assert "Deleted" in texts(at, "success")


def test_runs_page_open_in_live_and_add_to_compare(populated: list[int]) -> None:
    diverged = populated[STATUSES.index("diverged")]
    at = open_page("pages/runs.py")
    select_row(at, diverged)
    at.button(key="runs.compare").click().run()
    assert at.session_state[ui.COMPARE_KEY] == [diverged]
    at.button(key="runs.open").click().run()
    assert not at.exception
    assert at.session_state[ui.RUN_KEY] == diverged
    assert at.query_params.get("run") in (str(diverged), [str(diverged)])
    assert any(h.value.startswith(f"#{diverged} ") for h in at.subheader)  # Live's header


@pytest.mark.parametrize("page", PAGES)
def test_a_page_link_opened_first_still_goes_through_app_py(
    page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first request of a fresh server names a page (a bookmarked /live?run=3): Streamlit
    # would run that file alone, without app.py's navigation and sidebar.
    monkeypatch.setattr(streamlit_compat, "_rerouted", False)  # as in a freshly started server
    through_app: list[bool] = []  # app.py keeps the config's values on a page without it
    keep = sidebar.keep_values
    monkeypatch.setattr(sidebar, "keep_values", lambda: through_app.append(True) or keep())
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.switch_page(page).run()
    assert not at.exception
    if page in CONFIG_PAGES:  # the Playground starts from its own preset (issue 35)
        start = PLAYGROUND_PRESET if page == "pages/playground.py" else DEFAULT_PRESET
        assert at.sidebar.selectbox(key="cfg.preset").value == start
    else:
        assert through_app and not at.sidebar.selectbox


def test_unopenable_store_is_a_message_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    monkeypatch.setenv("BLOCKVIZ_STORE", str(folder))
    for page in MY_PAGES:
        at = open_page(page)
        assert not at.exception, page
        if page != "pages/parameters.py":  # needs no store
            assert str(folder) in texts(at, "error"), page


def test_locked_store_is_a_message_after_a_short_wait_not_a_hang(
    store: RunStore, populated: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_access, "PAGE_BUSY_TIMEOUT_S", 0.5)
    store.close()  # another process takes the lock below; nothing of ours may hold the file
    store_access._open_store.clear()
    locker = sqlite3.connect(default_store_path(), isolation_level=None)
    try:
        locker.execute("PRAGMA locking_mode = EXCLUSIVE")
        locker.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        at = open_page("pages/runs.py")
        assert not at.exception
        assert "locked" in texts(at, "error") and "Reload the page" in texts(at, "error")
        assert time.monotonic() - started < TIMEOUT
    finally:
        locker.close()
        store_access._open_store.clear()
    # Unlocked again: the same page reads the runs.
    at = open_page("pages/runs.py")
    assert not at.exception and "locked" not in texts(at, "error")
    assert len(at.dataframe[0].value) == len(populated)


@pytest.mark.slow
def test_launch_from_the_train_page_reaches_completed(store: RunStore) -> None:
    at = open_page("pages/train.py")
    at.selectbox(key="cfg.preset").set_value("tiny").run()
    at.number_input(key="cfg.max_steps").set_value(10).run()
    at.number_input(key="cfg.eval_interval").set_value(5).run()
    at.button(key="launch").click().run()
    assert not at.exception
    assert "Launched run #" in texts(at, "success"), texts(at, "error")
    (run_id,) = store.runs_frame()["id"].tolist()
    assert at.session_state[ui.RUN_KEY] == run_id
    deadline = time.monotonic() + 120
    while store.get_run(run_id).status in ("queued", "running"):
        assert time.monotonic() < deadline, "the launched run did not finish in 120 s"
        time.sleep(0.3)
    run = store.get_run(run_id)
    assert run.status == "completed", run.error
    assert run.name == at.text_input(key="run_name").value and run.step == 10


def test_launch_failure_shows_the_error_and_the_log_tail(
    store: RunStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An interpreter that fails at once stands in for a broken environment.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Traceback: boom, no blockviz here' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    at = open_page("pages/train.py")
    at.button(key="launch").click().run()
    assert not at.exception
    assert "Launch failed" in texts(at, "error") and "boom" in texts(at, "error")
    assert any("Traceback: boom" in code.value for code in at.code)
    (run_id,) = store.runs_frame()["id"].tolist()
    assert store.get_run(run_id).status == "failed"


# ---------------------------------------------------------------------------- read-only store

WRITE_BUTTONS = {
    "pages/train.py": ["launch", "train.stop.{running}"],
    "pages/live.py": ["live.stop", "live.resume"],
    "pages/runs.py": ["runs.stop", "runs.rename", "runs.delete", "runs.save_labels", "runs.resume"],
    "pages/compare.py": [],
}


@pytest.fixture
def readonly_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Opening the store read-write fails as on a read-only file; read-only opens work.

    (Tests run as root, which chmod cannot stop, so the refusal is simulated.) Yields the
    `readonly` flag of every open the pages attempted.
    """
    attempts: list[bool] = []

    def open_store(path: str, *, readonly: bool = False, **options: object) -> RunStore:
        attempts.append(readonly)
        if not readonly:
            raise StoreError(f"the run store {path} is not writable; set BLOCKVIZ_STORE")
        return RunStore(path, readonly=True, **options)

    store_access._open_store.clear()
    monkeypatch.setattr(store_access, "RunStore", opened_by(open_store))
    yield attempts
    store_access._open_store.clear()


@pytest.mark.parametrize("page", list(WRITE_BUTTONS))
def test_a_read_only_store_is_shown_with_writing_actions_off(
    store: RunStore, populated: list[int], readonly_only: list[bool], page: str
) -> None:
    running = populated[STATUSES.index("running")]
    store.close()  # the pages open their own
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[ui.RUN_KEY] = running
    at.session_state[ui.COMPARE_KEY] = [running]
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    assert readonly_only[:2] == [False, True]  # read-write first, then read-only
    assert store_access.READONLY_NOTICE in texts(at, "info")
    assert "Cannot open" not in texts(at, "error")
    for key in WRITE_BUTTONS[page]:
        assert at.button(key=key.format(running=running)).disabled, key
    if page == "pages/runs.py":
        assert len(at.dataframe[0].value) == len(populated)


def test_a_write_that_reaches_a_read_only_store_is_a_message_not_a_traceback(
    store: RunStore,
    populated: list[int],
    readonly_only: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Buttons enabled as if the store were writable (a tab opened before the file turned
    # read-only): what the click then does must still be a clear message.
    monkeypatch.setattr(store_access, "writable", lambda run_store: True)
    completed = populated[STATUSES.index("completed")]
    name = store.get_run(completed).name
    store.close()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[ui.RUN_KEY] = completed
    at.switch_page("pages/runs.py").run()
    at.text_input(key=f"runs.name.{completed}").set_value("renamed").run()
    at.button(key="runs.rename").click().run()
    assert not at.exception
    assert "read-only" in texts(at, "error")
    at.checkbox(key=f"runs.confirm.{completed}").check().run()
    at.button(key="runs.delete").click().run()
    assert not at.exception
    assert "read-only" in texts(at, "error")
    with RunStore(default_store_path(), readonly=True) as reread:
        assert reread.get_run(completed).name == name


@pytest.mark.parametrize(
    ("message", "falls_back"),
    [
        ("the run store {path} is not writable; set --store", True),
        ("the run store {path} is read-only here (attempt to write a readonly database)", True),
        ("cannot open the run store {path} (unable to open database file)", True),
        ("{path} is not a blockviz run store (not a valid SQLite file)", False),
        ("{path} was written by a newer blockviz (schema version 9)", False),
    ],
)
def test_only_a_store_that_cannot_be_written_is_opened_read_only(
    store: RunStore, monkeypatch: pytest.MonkeyPatch, message: str, falls_back: bool
) -> None:
    path = str(default_store_path().absolute())
    store.close()

    def open_store(path: str, *, readonly: bool = False, **options: object) -> RunStore:
        if not readonly:
            raise StoreError(message.format(path=path))
        return RunStore(path, readonly=True, **options)

    monkeypatch.setattr(store_access, "RunStore", opened_by(open_store))
    store_access._open_store.clear()
    try:
        if falls_back:
            assert store_access._open_store(path).readonly
        else:
            with pytest.raises(StoreError, match="blockviz"):
                store_access._open_store(path)
    finally:
        store_access._open_store.clear()


def test_a_locked_store_is_not_opened_read_only(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(default_store_path().absolute())
    opened: list[bool] = []

    def open_store(path: str, *, readonly: bool = False, **options: object) -> RunStore:
        opened.append(readonly)
        raise StoreLocked(f"the run store {path} stayed locked (read-only would not help)")

    monkeypatch.setattr(store_access, "RunStore", opened_by(open_store))
    store_access._open_store.clear()
    try:
        with pytest.raises(StoreLocked):
            store_access._open_store(path)
    finally:
        store_access._open_store.clear()
    assert opened == [False]
