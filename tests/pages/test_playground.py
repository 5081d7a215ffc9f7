"""The Playground loop (Auto-run on its own page): its pure bookkeeping and the page behaviour."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core import config, forks, spec
from blockviz.core.config import RunConfig
from blockviz.core.presets import DEFAULT_PRESET, PLAYGROUND_PRESET, PRESETS
from blockviz.core.tags import AUTO_TAG
from blockviz.dashboard import playground as page_part
from blockviz.dashboard.config_fields import QUICK_FIELDS
from blockviz.launch import runner
from blockviz.store import RunStore, StoreLocked, default_store_path
from blockviz.views import charts
from blockviz.views import playground as pg
from blockviz.views.export.render import chart_svg
from tests import fakes

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 30
PLAYGROUND = "pages/playground.py"
CADENCE = {"max_steps", "warmup_steps", "eval_interval", "eval_iters", "probe_interval"}
CADENCE |= {"sample_interval", "ckpt_interval"}


# ---------------------------------------------------------------------------- pure logic


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("steps", [pg.MIN_STEPS, pg.DEFAULT_STEPS, 1234])
def test_auto_config_changes_only_the_length_and_cadence(preset: str, steps: int) -> None:
    sidebar = config.preset(preset)
    auto = pg.auto_config(sidebar, steps)
    assert auto.train.max_steps == steps
    assert set(config.diff(sidebar, auto)) <= CADENCE  # the model and data stay as set
    assert auto.model == sidebar.model and auto.data == sidebar.data
    evaluations = steps // auto.train.eval_interval
    assert pg.EVALS_PER_RUN <= evaluations <= pg.EVALS_PER_RUN + 1
    assert auto.train.warmup_steps <= steps
    assert auto.train.eval_iters <= min(sidebar.train.eval_iters, pg.MAX_EVAL_ITERS)
    # Probes and samples at the first and last step only: nothing between.
    assert auto.train.probe_interval == steps and auto.train.sample_interval == steps
    # A throwaway run keeps no fork points (issue 35, defect 14): last.ckpt and best.ckpt only.
    assert auto.train.ckpt_interval == 0


def test_change_label_names_what_changed() -> None:
    before = config.preset("baby-cpu")
    assert pg.change_label(None, before, "baby-cpu") == "start: baby-cpu"
    assert pg.change_label(before, before, "baby-cpu") == "no change"
    post = config.replace(before, norm_position="post")
    assert pg.change_label(before, post, "baby-cpu") == "norm_position: pre → post"
    no_skip = config.replace(before, residual=False, final_norm=True)
    label = pg.change_label(before, no_skip, "baby-cpu")
    assert "residual: on → off" in label and "final_norm: auto → on" in label
    # The vocabulary follows the dataset: only the dataset is named.
    other_data = config.replace(before, dataset="pycode", vocab_size=99)
    assert pg.change_label(before, other_data, "baby-cpu") == "dataset: pydocs → pycode"


def test_change_label_stops_after_a_few_fields() -> None:
    before = config.preset("baby-cpu")
    changes = {"n_layer": 2, "n_head": 2, "d_model": 64, "lr": 0.01, "seed": 7}
    after = config.replace(before, **changes)
    label = pg.change_label(before, after, "baby-cpu")
    assert label.count("→") == pg.LABEL_FIELDS
    assert label.endswith(f"+{len(changes) - pg.LABEL_FIELDS} more")


def test_trail_keeps_the_newest_entries() -> None:
    trail: list[pg.TrailEntry] = []
    for run_id in range(1, 9):
        trail = pg.add_to_trail(
            trail, pg.TrailEntry(run_id, f"change {run_id}", f"c{run_id}", "{}"), 5
        )
        assert len(trail) == min(run_id, 5)
        assert trail[-1].run_id == run_id  # oldest first, newest last
    assert [e.run_id for e in trail] == list(range(4, 9))
    with pytest.raises(ValueError, match="trail length"):
        pg.add_to_trail(trail, trail[0], 0)


def test_trail_lines_mark_only_the_newest() -> None:
    trail = [pg.TrailEntry(i, f"label {i}", f"short {i}", "{}") for i in (3, 5, 9)]
    lines = pg.trail_lines(trail)
    assert [i for i, text in lines.items() if "(newest)" in text] == [9]
    assert all(text.startswith(f"#{i} label {i}") for i, text in lines.items())
    assert pg.legend_labels(trail) == {i: f"#{i} short {i}" for i in (3, 5, 9)}
    assert pg.trail_lines([]) == {} == pg.legend_labels([])


def test_trail_chart_names_runs_by_change_and_marks_the_newest_under_the_others(
    store: RunStore,
) -> None:
    ids = fakes.populate(store, n_runs=3, n_steps=40, n_layer=2)
    # Short labels as typed into a field: quotes and backslashes must not break the chart.
    trail = [pg.TrailEntry(i, f"long label {i}", f"c{i}='\\\"", "{}") for i in ids]
    scalars = store.scalars(ids, names=spec.LOSS_NAMES)
    chart = pg.trail_chart(scalars, trail)
    plain = charts.loss_chart(scalars)
    drawn = charts.chart_data(chart)
    assert set(drawn["run"]) == set(pg.legend_labels(trail).values())
    assert len(drawn) == len(charts.chart_data(plain))  # every point, relabelled only
    assert len(chart.layer) == len(plain.layer) + 1
    # The newest run's mark is the first layer, so every run's line is drawn over it: a
    # newer curve on top of an older one (the same config again) cannot hide it.
    halo = chart.layer[0].to_dict()
    assert halo["mark"]["strokeWidth"] == pg.NEWEST_WIDTH
    assert halo["mark"]["opacity"] == pg.NEWEST_OPACITY < 0.5
    newest = pg.legend_labels(trail)[ids[-1]]
    assert {"field": "run", "equal": newest} in [t["filter"] for t in halo["transform"]]
    svg = chart_svg(chart)  # Vega renders it: params intact, the filter matches
    width = f'stroke-width="{pg.NEWEST_WIDTH}"'
    assert width in svg and width not in chart_svg(plain)
    assert svg.index(width) < svg.index('stroke-width="2"')  # drawn before (under) the lines
    assert all(f"#{i} c{i}=" in svg for i in ids)  # the runs' legend is kept
    assert "no data yet" in json.dumps(pg.trail_chart(scalars.iloc[:0], trail).to_dict())


def test_the_first_label_says_what_the_config_is_not_only_its_preset() -> None:
    base = pg.auto_config(config.preset("tiny"), 300)
    assert pg.change_label(None, base, "tiny") == "start: tiny"
    wider = config.replace(base, d_model=64)
    assert pg.change_label(None, wider, "tiny") == "start: tiny + d_model: 32 → 64"
    assert pg.change_label(None, wider, "tiny", short=True) == "start: tiny + d_model=64"
    # The steps an auto-run trains are the Playground's setting, not a change of the config.
    assert pg.change_label(None, pg.auto_config(config.preset("tiny"), 40), "tiny") == (
        "start: tiny"
    )


def test_debounce_waits_for_a_settled_config() -> None:
    debounce = 1.0
    pending = pg.observe(None, "A", now=100.0)
    assert not pg.should_launch(pending, 100.0 + debounce / 2, None, debounce)
    # Another change before the wait is over restarts the clock.
    pending = pg.observe(pending, "B", now=100.0 + debounce * 0.9)
    assert not pg.should_launch(pending, 100.0 + debounce * 1.1, None, debounce)
    assert pg.should_launch(pending, 100.0 + debounce * 1.9, None, debounce)
    # The same config seen again keeps its first time.
    assert pg.observe(pending, "B", now=500.0) == pending
    # Never twice for the config launched last, however long it sits.
    assert not pg.should_launch(pending, 10_000.0, "B", debounce)
    assert pg.should_launch(pending, 10_000.0, "A", debounce)


# ---------------------------------------------------------------------------- the page


@pytest.fixture
def store() -> Iterator[RunStore]:
    run_store = RunStore(default_store_path())
    yield run_store
    run_store.close()


class FakeRunner:
    """runner.launch / stop_run stand-ins: runs recorded in the store, no processes."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.launched: list[tuple[RunConfig, dict[str, Any]]] = []
        self.stopped: list[int] = []

    def launch(self, run_config: RunConfig, name: str | None, store: RunStore, **kw: Any) -> int:
        self.launched.append((run_config, kw))
        return store.create_run(
            name or "run",
            run_config.to_json(),
            status="running",
            max_steps=run_config.train.max_steps,
            tags=kw.get("tags", ()),
        )

    def stop_run(self, store: RunStore, run_id: int) -> runner.StopOutcome:
        self.stopped.append(run_id)
        store.update_run(run_id, status="stopped", ended=time.time())
        return runner.StopOutcome("stopped")


@pytest.fixture
def fake_runner(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> FakeRunner:
    fake = FakeRunner(store)
    monkeypatch.setattr(runner, "launch", fake.launch)
    monkeypatch.setattr(runner, "stop_run", fake.stop_run)
    return fake


def _playground() -> AppTest:
    """The app opened on the Playground page, run once."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.switch_page(PLAYGROUND)
    return at.run()


def _on_with_d_model(d_model: int) -> AppTest:
    """The Playground with d_model set in the sidebar, then Auto-run switched on."""
    at = _playground()
    at.number_input(key="cfg.d_model").set_value(d_model).run()
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    assert not at.exception
    return at


def _texts(at: AppTest, kind: str) -> str:
    return "\n".join(str(e.value).replace("\\", "") for e in getattr(at, kind))


def test_switching_auto_run_on_launches_the_sidebar_config_once(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    at = _playground()
    assert not fake_runner.launched  # off by default
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    assert not at.exception
    ((launched, options),) = fake_runner.launched
    steps = at.number_input(key=page_part.STEPS_KEY).value
    assert launched.train.max_steps == steps
    assert options["tags"] == (AUTO_TAG,)
    assert launched.model.norm_position == at.selectbox(key="cfg.norm_position").value
    (row,) = store.runs_frame().itertuples()
    assert AUTO_TAG in row.tags.split(", ")
    # The same config again, on any rerun: nothing more is launched.
    at.run()
    at.run()
    assert len(fake_runner.launched) == 1
    assert f"start: {PLAYGROUND_PRESET}" in _texts(at, "markdown")


def test_a_change_stops_the_active_auto_run_and_launches_the_new_config(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    at = _playground()
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    first = store.runs_frame()["id"].tolist()
    at.selectbox(key="cfg.norm_position").set_value("post").run()
    assert not at.exception
    assert fake_runner.stopped == first  # replaced, not queued behind
    assert [c.model.norm_position for c, _ in fake_runner.launched] == ["pre", "post"]
    shown = _texts(at, "markdown")
    assert "#2 norm_position: pre → post (newest) · running" in shown
    assert (
        f"#1 start: {PLAYGROUND_PRESET} · stopped" in shown
    )  # the replaced run stays in the trail
    assert len(at.session_state[page_part.TRAIL_KEY]) == 2


def test_a_change_waits_until_the_config_settles(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.5)
    at = _playground()
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    assert not fake_runner.launched  # just changed: not settled yet
    time.sleep(0.6)
    at.run()  # what the launcher fragment's timer does
    assert len(fake_runner.launched) == 1


def test_an_invalid_config_launches_nothing_and_says_why(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    at = _on_with_d_model(33)  # not a multiple of n_head
    assert not fake_runner.launched
    assert "Auto-run launches nothing" in _texts(at, "warning")
    assert "d_model" in _texts(at, "warning")


@pytest.mark.slow
def test_auto_run_trains_a_real_run_and_draws_its_loss(store: RunStore) -> None:
    at = _playground()
    at.selectbox(key="cfg.preset").set_value("tiny").run()
    at.number_input(key=page_part.STEPS_KEY).set_value(pg.MIN_STEPS).run()
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    deadline = time.monotonic() + pg.DEBOUNCE_S + 5
    while store.runs_frame().empty:
        assert time.monotonic() < deadline, "no auto-run launched"
        time.sleep(pg.DEBOUNCE_S / 2)
        at.run()
    (run_id,) = store.runs_frame()["id"].tolist()
    deadline = time.monotonic() + 120
    while store.get_run(run_id).status in ("queued", "running"):
        assert time.monotonic() < deadline, "the auto-run did not finish in 120 s"
        time.sleep(0.5)
    run = store.get_run(run_id)
    assert run.status == "completed", run.error
    assert run.step == pg.MIN_STEPS and AUTO_TAG in run.tags
    # A throwaway run: no fork points, only last.ckpt and best.ckpt (issue 35, defect 14).
    checkpoints = store.run_dir(run_id) / forks.CHECKPOINTS_DIR
    assert sorted(p.name for p in checkpoints.glob("*.ckpt")) == ["best.ckpt", "last.ckpt"]
    at.run()
    assert not at.exception and not _texts(at, "error")
    assert "completed" in _texts(at, "markdown")
    (drawn,) = _chart_frames(at, "Auto-runs: loss")
    assert set(drawn["run"]) == {f"#{run_id} start: tiny"}
    losses = drawn[drawn["name"] == "train/loss"]
    assert len(losses) == len(store.scalars(run_id, names="train/loss")) > 0


def _chart_frames(at: AppTest, title: str) -> list[pd.DataFrame]:
    """The data frames the page sent for the chart titled `title` (decoded from Arrow)."""
    found = []
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        shown = spec.get("title")
        if (shown.get("text") if isinstance(shown, dict) else shown) == title:
            found += [
                pa.ipc.open_stream(d.data.data).read_all().to_pandas()
                for d in element.proto.datasets
            ]
    return found


def test_a_failed_launch_says_why_and_is_not_retried(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    calls: list[RunConfig] = []

    def failing(run_config: RunConfig, *args: Any, **kw: Any) -> int:
        calls.append(run_config)
        raise runner.LaunchError("could not start the training process (**boom**)")

    monkeypatch.setattr(runner, "launch", failing)
    at = _playground()
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    at.run()
    assert not at.exception and len(calls) == 1  # the same config is not launched again
    assert "Auto-run failed to launch: could not start the training process (**boom**)" in (
        _texts(at, "error")
    )


def test_a_read_only_store_disables_the_switch(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    monkeypatch.setattr(page_part.store_access, "writable", lambda run_store: False)
    at = _playground()
    assert at.toggle(key=page_part.TOGGLE_KEY).disabled
    at.session_state[page_part.TOGGLE_KEY] = True  # even if it were on
    at.run()
    assert not at.exception and not fake_runner.launched


def test_auto_run_stays_on_across_pages_and_launches_what_changed_meanwhile(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    at = _playground()
    at.number_input(key=page_part.STEPS_KEY).set_value(pg.MIN_STEPS).run()
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    at.switch_page("pages/parameters.py").run()
    at.selectbox(key="cfg.norm_position").set_value("post").run()
    assert len(fake_runner.launched) == 1  # the Playground launches only while it is open
    at.switch_page(PLAYGROUND).run()
    assert not at.exception
    assert at.toggle(key=page_part.TOGGLE_KEY).value
    assert at.number_input(key=page_part.STEPS_KEY).value == pg.MIN_STEPS
    assert [c.model.norm_position for c, _ in fake_runner.launched] == ["pre", "post"]
    assert fake_runner.launched[-1][0].train.max_steps == pg.MIN_STEPS


def test_a_locked_store_while_stopping_retries_instead_of_skipping_the_change(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    at = _playground()
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    stop_for_real = fake_runner.stop_run
    refusals = [StoreLocked("the run store is locked by another process; try again")]

    def locked_once(run_store: RunStore, run_id: int) -> runner.StopOutcome:
        if refusals:
            raise refusals.pop()
        return stop_for_real(run_store, run_id)

    monkeypatch.setattr(runner, "stop_run", locked_once)
    at.selectbox(key="cfg.norm_position").set_value("post").run()
    assert "locked" in _texts(at, "error")
    assert len(fake_runner.launched) == 1  # not launched beside a run it could not stop
    at.run()  # the launcher's next look
    assert [c.model.norm_position for c, _ in fake_runner.launched] == ["pre", "post"]
    assert fake_runner.stopped == store.runs_frame()["id"].tolist()[:1]


def test_the_trail_words_a_queued_run_with_a_free_slot_as_every_page_does(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    monkeypatch.setenv("BLOCKVIZ_MAX_RUNNING", "2")
    launch = fake_runner.launch

    def queued(*args: Any, **kw: Any) -> int:  # launched, its process not yet running
        run_id = launch(*args, **kw)
        store.update_run(run_id, status="queued", heartbeat=time.time())
        return run_id

    monkeypatch.setattr(runner, "launch", queued)
    at = _playground()
    at.toggle(key=page_part.TOGGLE_KEY).set_value(True).run()
    assert not at.exception
    (run_id,) = store.runs_frame()["id"].tolist()
    assert runner.shown_in(store.runs_frame())[run_id] == "starting"  # Train, Live, Runs
    assert f"#{run_id} start: {PLAYGROUND_PRESET} (newest) · starting" in _texts(at, "markdown")


def test_the_first_trail_entry_names_what_differs_from_its_preset(
    store: RunStore, fake_runner: FakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "DEBOUNCE_S", 0.0)
    at = _on_with_d_model(64)
    shown = _texts(at, "markdown")
    assert f"#1 start: {PLAYGROUND_PRESET} + d_model: 32 → 64 (newest) · running" in shown


def test_the_quick_fields_sit_beside_the_chart_and_hold_the_sidebars_values(
    store: RunStore,
) -> None:
    at = _playground()
    assert not at.exception
    for name in QUICK_FIELDS:
        key = f"cfg.{name}"
        assert key not in {w.key for w in at.sidebar.get(_kind(name))}, name
        assert key in {w.key for w in at.main.get(_kind(name))}, name
    # One value: set beside the chart, the other pages' sidebar shows it, and back.
    at.selectbox(key="cfg.norm_position").set_value("post").run()
    at.switch_page("pages/train.py").run()
    assert at.sidebar.selectbox(key="cfg.norm_position").value == "post"
    at.sidebar.number_input(key="cfg.n_layer").set_value(3).run()
    at.switch_page(PLAYGROUND).run()
    assert at.main.number_input(key="cfg.n_layer").value == 3
    assert at.main.selectbox(key="cfg.norm_position").value == "post"


def _kind(name: str) -> str:
    """The AppTest element type of a config field's widget."""
    from blockviz.dashboard.config_fields import SPECS

    kind = SPECS[name].kind
    return {"select": "selectbox", "bool": "toggle"}.get(kind, "number_input")


# ---------------------------------------------------------------------------- issue 35


def test_the_playground_starts_from_its_preset_unless_the_config_was_changed(
    store: RunStore,
) -> None:
    at = _playground()  # a session opened on the Playground
    assert at.sidebar.selectbox(key="cfg.preset").value == PLAYGROUND_PRESET
    start = config.preset(PLAYGROUND_PRESET)
    assert at.number_input(key="cfg.n_layer").value == start.model.n_layer
    assert at.number_input(key="cfg.lr").value == pytest.approx(start.train.lr)
    # Opened on Train with nothing changed: the Playground still opens on its preset.
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert at.sidebar.selectbox(key="cfg.preset").value == DEFAULT_PRESET
    at.switch_page(PLAYGROUND).run()
    assert at.sidebar.selectbox(key="cfg.preset").value == PLAYGROUND_PRESET
    at.switch_page("pages/train.py").run()  # and Train keeps it from then on
    assert at.sidebar.selectbox(key="cfg.preset").value == PLAYGROUND_PRESET
    # A config changed on Train first is the user's: the Playground keeps it.
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.number_input(key="cfg.n_layer").set_value(3).run()
    at.switch_page(PLAYGROUND).run()
    assert not at.exception
    assert at.sidebar.selectbox(key="cfg.preset").value == DEFAULT_PRESET
    assert at.number_input(key="cfg.n_layer").value == 3


def test_a_field_without_a_visible_gap_at_the_start_says_why_on_the_page(
    store: RunStore,
) -> None:
    assert pg.NO_GAP_NOTES, "every field shows a gap: drop this test's premise, not the check"
    assert set(pg.NO_GAP_NOTES) <= set(QUICK_FIELDS)
    at = _playground()
    captions = _texts(at, "caption")
    for name, note in pg.NO_GAP_NOTES.items():
        assert note.replace("\\", "") in captions, name
    # They say what flipping one field alone does: Norm position flipped, none stays.
    at.selectbox(key="cfg.norm_position").set_value("post").run()
    captions = _texts(at, "caption")
    assert not [n for n in pg.NO_GAP_NOTES.values() if n.replace("\\", "") in captions]
    at.selectbox(key="cfg.norm_position").set_value("pre").run()
    assert all(n.replace("\\", "") in _texts(at, "caption") for n in pg.NO_GAP_NOTES.values())
    # The notes are about the Playground's preset: another preset shows none of them.
    at.sidebar.selectbox(key="cfg.preset").set_value("baby-cpu").run()
    captions = _texts(at, "caption")
    assert not [n for n in pg.NO_GAP_NOTES.values() if n in captions]
