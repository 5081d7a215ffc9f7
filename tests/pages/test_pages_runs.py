"""The Runs page (issue 13): a table that follows training, rename, delete of an active run,
tags and notes with the tag filter (also on Compare), Edit & relaunch and Resume; (issue 23)
the clicked row is the run the actions apply to, and the summary and table follow the store."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core import config as cfg
from blockviz.core import disk
from blockviz.core.tags import AUTO_TAG
from blockviz.dashboard import runs_panel, sidebar, tables, ui
from blockviz.dashboard.uploads import UPLOAD_INFO_KEY
from blockviz.launch import runner
from blockviz.store import RunStore, default_store_path
from tests import fakes
from tests.helpers import FOX_TEXT, rerun_only, select_row, selected_rows, tiny_config
from tests.real_runs import RealRuns, copy_run

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 30
STATUSES = ("completed", "running", "stopped")
TABLE_KEY = runs_panel.TABLE_KEY


@pytest.fixture
def store() -> Iterator[RunStore]:
    run_store = RunStore(default_store_path())
    yield run_store
    run_store.close()


@pytest.fixture
def runs(store: RunStore) -> dict[str, int]:
    """Three small fake runs by status (the running one belongs to this process)."""
    ids = fakes.populate(store, n_runs=3, n_steps=40, n_layer=2, statuses=STATUSES)
    return dict(zip(STATUSES, ids, strict=True))


def open_page(page: str, run_id: int | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if run_id is not None:
        at.session_state[ui.RUN_KEY] = run_id
    at.run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest, kind: str) -> str:
    """What the elements say, with ui.plain's backslash escapes removed."""
    return "\n".join(str(e.value).replace("\\", "") for e in getattr(at, kind))


def shown_ids(at: AppTest) -> set[int]:
    return {int(i) for i in at.dataframe[0].value["id"]}


def title(at: AppTest) -> str:
    return at.title[0].value


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """{fragment id: seconds}: the run_every timers of the page's last full run, which a
    browser keeps running until the next full run."""
    from streamlit.testing.v1 import local_script_runner

    found: dict[str, float] = {}
    parse = local_script_runner.parse_tree_from_messages

    def recording(messages: list) -> object:
        if any(m.HasField("delta") and not m.delta.fragment_id for m in messages):
            found.clear()  # a full run: the browser drops the old timers
        found.update(
            {
                m.auto_rerun.fragment_id: m.auto_rerun.interval
                for m in messages
                if m.HasField("auto_rerun")
            }
        )
        return parse(messages)

    monkeypatch.setattr(local_script_runner, "parse_tree_from_messages", recording)
    return found


def tick(at: AppTest, timers: dict[str, float]) -> AppTest:
    """What the page's timers do in a browser: rerun the fragments that have one, only them."""
    assert timers, "the page set no timer: nothing would refresh it"
    return rerun_only(at, list(timers), is_auto_rerun=True)


def summary(at: AppTest) -> str:
    return next(c.value for c in at.caption if " run(s) in " in c.value)


# ---------------------------------------------------------------------------- 6, 7, 8a


def test_the_table_follows_a_training_run_then_stops_refreshing(
    store: RunStore, runs: dict[str, int], timers: dict[str, float]
) -> None:
    running = runs["running"]
    at = open_page("pages/runs.py")
    assert sorted(timers.values()) == [runs_panel.REFRESH_S]
    before = at.dataframe[0].value.set_index("id").loc[running, "step"]
    store.update_run(running, step=33)
    tick(at, timers)  # what the 2 s timer does in a browser
    after = at.dataframe[0].value.set_index("id").loc[running, "step"]
    assert after != before and after.startswith("33 /")
    # The run ends: the table shows it, and the page drops its 2 s timer (what is left
    # only watches for a run started elsewhere).
    store.update_run(running, status="completed", ended=time.time())
    tick(at, timers)
    assert at.dataframe[0].value.set_index("id").loc[running, "status"] == "completed"
    assert sorted(timers.values()) == [runs_panel.WATCH_S]


def test_after_a_rename_the_box_shows_the_stored_name(
    store: RunStore, runs: dict[str, int]
) -> None:
    run_id = runs["completed"]
    at = open_page("pages/runs.py", run_id)
    typed = "renamed run / with slash!"
    at.text_input(key=f"runs.name.{run_id}").set_value(typed).run()
    at.button(key="runs.rename").click().run()
    assert not at.exception
    stored = store.get_run(run_id).name
    assert stored != typed  # the store sanitises; the box must say what it kept
    assert at.text_input(key=f"runs.name.{run_id}").value == stored
    assert stored in texts(at, "success")


def test_delete_is_off_for_an_active_run_saying_why(store: RunStore, runs: dict[str, int]) -> None:
    at = open_page("pages/runs.py", runs["running"])
    confirm = at.checkbox(key=f"runs.confirm.{runs['running']}")
    delete = at.button(key="runs.delete")
    assert confirm.disabled and delete.disabled
    assert "stop it first" in delete.help
    select_row(at, runs["stopped"])
    assert not at.checkbox(key=f"runs.confirm.{runs['stopped']}").disabled


# ---------------------------------------------------------------------------- 15: tags, notes


def test_tags_and_notes_are_saved_shown_cleaned_and_refused_with_the_reason(
    store: RunStore, runs: dict[str, int]
) -> None:
    run_id = runs["completed"]
    at = open_page("pages/runs.py", run_id)
    at.text_input(key=f"runs.tags.{run_id}").set_value(" post-ln, sweep,post-ln ").run()
    at.text_area(key=f"runs.notes.{run_id}").set_value("**why**: lr <b>sweep</b>\nline 2").run()
    at.button(key="runs.save_labels").click().run()
    assert not at.exception and not at.error
    run = store.get_run(run_id)
    assert run.tags == ("post-ln", "sweep") and run.notes.endswith("line 2")
    # The box shows what was stored; the table has a tags column.
    assert at.text_input(key=f"runs.tags.{run_id}").value == "post-ln, sweep"
    assert at.dataframe[0].value.set_index("id").loc[run_id, "tags"] == "post-ln, sweep"

    at.text_input(key=f"runs.tags.{run_id}").set_value("two words").run()
    at.button(key="runs.save_labels").click().run()
    assert not at.exception
    assert "a space" in texts(at, "error")
    assert store.get_run(run_id).tags == ("post-ln", "sweep")


def test_tag_filter_and_hidden_auto_runs_on_runs_and_compare(
    store: RunStore, runs: dict[str, int]
) -> None:
    store.set_tags(runs["completed"], "sweep, post-ln")
    store.set_tags(runs["stopped"], "sweep")
    auto = store.create_run("auto-1", fakes.fake_config().to_json(), status="completed")
    store.set_tags(auto, AUTO_TAG)
    at = open_page("pages/runs.py")
    assert auto not in shown_ids(at)  # hidden by default
    toggle = at.toggle(key="runs.filter.auto")
    assert toggle.label == "Show auto-runs (1)"
    toggle.set_value(True).run()
    assert auto in shown_ids(at)
    at.multiselect(key="runs.filter.tags").set_value(["sweep"]).run()
    assert shown_ids(at) == {runs["completed"], runs["stopped"]}
    at.multiselect(key="runs.filter.tags").set_value(["sweep", "post-ln"]).run()
    assert shown_ids(at) == {runs["completed"]}
    # The selected run is filtered out: no row is selected, and the page says why.
    assert selected_rows(at) == []
    assert f"Run #{runs['stopped']} is hidden by the filter above" in texts(at, "info")
    at.multiselect(key="runs.filter.tags").set_value([]).run()
    assert selected_rows(at) == [runs["stopped"]]  # let back in, selected again

    at = open_page("pages/compare.py")
    picker = at.multiselect(key="compare.runs")
    assert ui.run_label(store.get_run(auto).to_dict()) not in picker.options
    assert auto not in at.session_state[ui.COMPARE_KEY]  # not preselected either
    at.multiselect(key="compare.filter.tags").set_value(["post-ln"]).run()
    assert at.multiselect(key="compare.runs").options == [
        ui.run_label(store.get_run(runs["completed"]).to_dict())
    ]


# ---------------------------------------------------------------------------- 11: relaunch


@pytest.mark.parametrize("page", ["pages/runs.py", "pages/live.py"])
def test_edit_and_relaunch_loads_the_config_into_the_sidebar_and_opens_train(
    store: RunStore, page: str, tmp_path: Path
) -> None:
    text = tmp_path / "mine.txt"
    text.write_text(FOX_TEXT, encoding="utf-8")
    wanted = cfg.replace(
        cfg.preset("tiny"), n_layer=3, norm_position="post", lr=2e-3, dataset=str(text)
    )
    run_id = store.create_run("mine", wanted.to_json(), status="stopped")
    at = open_page(page, run_id)
    prefix = "runs" if page == "pages/runs.py" else "live"
    at.button(key=f"{prefix}.relaunch").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert title(at) == "Train"
    assert at.session_state[sidebar.PRESET_KEY] == "tiny"  # the nearest preset
    assert at.session_state["cfg.n_layer"] == 3
    assert at.session_state["cfg.norm_position"] == "post"
    # The file still exists: it is the upload now, and the sidebar's config can launch.
    assert at.session_state[UPLOAD_INFO_KEY].n_chars == len(FOX_TEXT)
    assert not at.button(key="launch").disabled, texts(at, "error") + texts(at, "warning")
    assert at.number_input(key="cfg.lr").value == 2e-3
    assert "Loaded run" in texts(at, "info")


def test_relaunch_of_a_run_whose_dataset_file_is_gone_keeps_the_current_dataset(
    store: RunStore, runs: dict[str, int]
) -> None:
    at = open_page("pages/runs.py", runs["completed"])  # its dataset is fox.txt: no such file
    at.button(key="runs.relaunch").click().run()
    assert not at.exception
    assert title(at) == "Train"
    assert at.session_state["cfg.dataset"] == cfg.RunConfig().data.dataset  # as it was
    assert "fox.txt is gone" in texts(at, "info")


@pytest.mark.parametrize(
    ("field", "value"), [("retired_field", 1), ("norm_type", "groupnorm"), ("init", None)]
)
def test_relaunch_of_a_config_that_no_longer_reads_is_a_message(
    store: RunStore, field: str, value: object
) -> None:
    old = json.loads(tiny_config().to_json())
    old["model"][field] = value
    run_id = store.create_run("old", json.dumps(old), status="completed")
    at = open_page("pages/runs.py", run_id)
    at.button(key="runs.relaunch").click().run()
    assert not at.exception
    assert title(at) == "Runs"
    assert field in texts(at, "error")


def test_relaunch_of_a_config_whose_numbers_no_longer_validate_shows_the_field(
    store: RunStore,
) -> None:
    old = json.loads(tiny_config().to_json())
    old["model"].update(d_model=130, n_head=4)  # heads must divide the width
    run_id = store.create_run("old", json.dumps(old), status="completed")
    at = open_page("pages/runs.py", run_id)
    at.button(key="runs.relaunch").click().run()
    assert not at.exception
    assert title(at) == "Train"
    assert at.button(key="launch").disabled
    assert "n_head" in texts(at, "error")


# ---------------------------------------------------------------------------- 11: resume


def test_resume_is_offered_only_where_it_can_work(store: RunStore, runs: dict[str, int]) -> None:
    at = open_page("pages/runs.py", runs["completed"])
    resume = at.button(key="runs.resume")
    assert resume.disabled and "max_steps" in resume.help
    select_row(at, runs["stopped"])
    resume = at.button(key="runs.resume")
    assert resume.disabled and "no checkpoint" in resume.help
    ckpt = runner.checkpoint_path(store, runs["stopped"])
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"")
    at.run()
    assert not at.button(key="runs.resume").disabled
    select_row(at, runs["running"])
    assert at.button(key="runs.resume").disabled


@pytest.mark.slow
def test_resume_from_the_page_continues_to_max_steps_without_repeating_steps(
    store: RunStore, real_runs: RealRuns
) -> None:
    # A real 30-step run with its checkpoint, made to look stopped at step 30 of 34.
    run_id = copy_run(store, real_runs.path, real_runs.ids["pre"])
    with RunStore(real_runs.path, readonly=True) as real:
        source = runner.checkpoint_path(real, real_runs.ids["pre"])
    target = runner.checkpoint_path(store, run_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    config_path = store.run_dir(run_id) / "config.json"
    longer = cfg.replace(cfg.RunConfig.from_json(config_path.read_text()), max_steps=34)
    config_path.write_text(longer.to_json())
    store.update_run(run_id, status="stopped", max_steps=34)
    store.flush()

    at = open_page("pages/runs.py", run_id)
    at.button(key="runs.resume").click().run()
    assert not at.exception and not at.error, texts(at, "error")
    assert "Resuming run" in texts(at, "success")
    deadline = time.monotonic() + 120
    while store.get_run(run_id).status not in ("completed", "failed", "diverged"):
        assert time.monotonic() < deadline, runner.log_tail(store, run_id)
        time.sleep(0.2)
    run = store.get_run(run_id)
    assert run.status == "completed" and run.step == 34, runner.log_tail(store, run_id)
    loss = store.scalars(run_id, names="train/loss")
    assert loss["step"].is_unique, loss["step"].tolist()
    assert (loss["step"] < 30).any() and (loss["step"] >= 30).any()
    assert "resuming from step 30" in runner.log_tail(store, run_id)


# ---------------------------------------------------------------------------- issue 23: 7


def test_the_clicked_row_is_the_run_the_actions_apply_to(
    store: RunStore, runs: dict[str, int]
) -> None:
    at = open_page("pages/runs.py")
    assert not [s for s in at.selectbox if s.key == "runs.pick"]  # no second picker
    newest = max(runs.values())
    assert selected_rows(at) == [newest]  # as before, the newest run until one is clicked
    assert at.checkbox(key=f"runs.confirm.{newest}")

    running = runs["running"]
    select_row(at, running)
    assert selected_rows(at) == [running]
    # The actions below the table now act on the clicked run, and the URL names it.
    assert f"runs.confirm.{running}" in [c.key for c in at.checkbox]
    assert at.checkbox(key=f"runs.confirm.{running}").disabled  # running: stop it first
    assert at.button(key="runs.stop")
    assert at.session_state[ui.RUN_KEY] == running
    assert at.query_params.get("run") in (str(running), [str(running)])

    select_row(at, None)  # the selected row clicked off: no run to act on, and a hint
    assert selected_rows(at) == []
    assert "Click a row" in texts(at, "info")
    assert not [b for b in at.button if b.key in ("runs.open", "runs.delete", "runs.stop")]
    at.run()  # and it stays so
    assert selected_rows(at) == [] and "Click a row" in texts(at, "info")


def test_a_run_named_in_the_url_is_the_selected_row(store: RunStore, runs: dict[str, int]) -> None:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["run"] = str(runs["completed"])
    at.run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    assert selected_rows(at) == [runs["completed"]]
    assert at.text_input(key=f"runs.name.{runs['completed']}")


def test_the_selection_stays_on_its_run_when_a_new_run_appears(
    store: RunStore, runs: dict[str, int], timers: dict[str, float]
) -> None:
    at = open_page("pages/runs.py")
    select_row(at, runs["running"])
    newer = fakes.add_run(store, fakes.fake_config(), "queued", name="from-cli")
    tick(at, timers)
    assert newer in shown_ids(at)  # on top, so every row below moved down one
    assert selected_rows(at) == [runs["running"]]
    at.run()
    assert selected_rows(at) == [runs["running"]]
    assert at.checkbox(key=f"runs.confirm.{runs['running']}")


def test_a_diverged_runs_val_loss_reads_diverged(store: RunStore) -> None:
    config = fakes.fake_config()
    blew_up = store.create_run("blew-up", config.to_json(), status="diverged")
    store.update_run(blew_up, diverged_step=7, step=7)
    inf = store.create_run("inf", config.to_json(), status="diverged")
    store.log_scalars(inf, [(5, "val/loss", float("inf"))])  # kept as it is, unlike NaN
    store.flush()
    fresh = store.create_run("fresh", config.to_json(), status="stopped")
    done = fakes.add_run(store, config, "completed", name="done")
    at = open_page("pages/runs.py")
    val_loss = at.dataframe[0].value.set_index("id")["val loss"]
    assert val_loss[blew_up] == val_loss[inf] == "diverged"
    assert val_loss[fresh] == "—"  # no evaluation yet: not a grey None either
    assert val_loss[done] == f"{store.runs_frame().set_index('id').loc[done, 'val_loss']:.4f}"
    # Compare's final-metrics table says it too.
    final = tables.final_table(store, [blew_up, done]).set_index("run")
    assert final.loc["blew-up", "val_loss"] == "diverged"
    assert final.loc["blew-up", "diverged_at"] == "7"
    assert final.loc["done", "val_loss"] != "diverged"


# ---------------------------------------------------------------------------- issue 23: 10


def test_the_summary_line_follows_a_run_that_ends_and_one_that_resumes(
    store: RunStore, runs: dict[str, int], timers: dict[str, float]
) -> None:
    at = open_page("pages/runs.py")
    assert "1 running" in summary(at) and "1 stopped" in summary(at)
    store.update_run(runs["stopped"], status="running", heartbeat=time.time())  # resumed
    tick(at, timers)
    assert "2 running" in summary(at) and "stopped" not in summary(at)
    store.update_run(runs["running"], status="completed", ended=time.time())
    tick(at, timers)
    assert "1 running" in summary(at) and "2 completed" in summary(at)


def test_a_run_launched_from_the_cli_appears_while_nothing_runs(
    store: RunStore, timers: dict[str, float]
) -> None:
    (done,) = fakes.populate(store, n_runs=1, n_steps=40, n_layer=2, statuses=("completed",))
    at = open_page("pages/runs.py")
    assert "1 completed" in summary(at)
    tick(at, timers)  # nothing changed: nothing is redrawn (the tree holds what was)
    assert not at.dataframe and not at.caption
    launched = fakes.add_run(store, fakes.fake_config(), "queued", name="from-cli")
    tick(at, timers)
    assert shown_ids(at) == {done, launched}
    assert "2 run(s)" in summary(at) and "1 starting" in summary(at)
    assert timers  # and the page now follows it on the faster timer


# ---------------------------------------------------------------------------- issue 35, 14


def test_the_table_shows_each_runs_disk_and_the_page_warns_past_the_size(
    store: RunStore, runs: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    completed = runs["completed"]
    checkpoints = store.run_dir(completed) / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    (checkpoints / "last.ckpt").write_bytes(b"x" * 3_000_000)
    monkeypatch.delenv(disk.WARN_ENV, raising=False)
    at = open_page("pages/runs.py")
    sizes = at.dataframe[0].value.set_index("id")["disk"]
    assert sizes.loc[completed] >= 3.0  # MB: its checkpoint, with its config and log
    assert not [w for w in at.warning if "Checkpoints take" in str(w.value)]
    monkeypatch.setenv(disk.WARN_ENV, "2")
    at = open_page("pages/runs.py")
    warning = texts(at, "warning")
    assert "Checkpoints take 3.0 MB in " in warning and "past the 2.0 MB" in warning
    assert "Delete" in warning and disk.WARN_ENV in warning
    monkeypatch.setenv(disk.WARN_ENV, "a lot")  # a bad setting is said, not a traceback
    at = open_page("pages/runs.py")
    assert f"${disk.WARN_ENV}: 'a lot' is not allowed" in texts(at, "warning")
