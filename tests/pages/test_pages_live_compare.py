"""AppTest of the Live and Compare pages against empty stores, real runs and fake ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core import config as cfg
from blockviz.dashboard import store_access
from blockviz.dashboard.code_download import LABEL as CODE_LABEL
from blockviz.store import RunStore
from tests import fakes
from tests.helpers import chart_specs, shown
from tests.real_runs import RealRuns, copy_run

PAGES = Path(__file__).resolve().parents[2] / "pages"
LIVE_TABS = ("Loss", "Gradients", "Activations", "Updates", "Attention", "Samples")
EXPORT_LABELS = {"PNG", "SVG", "HTML", "CSV"}


def _page(name: str) -> AppTest:
    return AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=60)


def _live(run_id: int) -> AppTest:
    """The Live page set to show `run_id` (not run yet)."""
    at = _page("live")
    at.session_state["run_id"] = run_id
    return at


def _charts(at: AppTest) -> dict[str, list[pd.DataFrame]]:
    """Chart title -> the data frames the page sent for it (decoded from Arrow)."""
    found: dict[str, list[pd.DataFrame]] = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        title = spec.get("title")
        title = title.get("text") if isinstance(title, dict) else title
        frames = [
            pa.ipc.open_stream(dataset.data.data).read_all().to_pandas()
            for dataset in element.proto.datasets
        ]
        found[str(title)] = frames
    return found


def _labels(at: AppTest) -> list[str]:
    return [button.label for button in at.download_button]


@pytest.fixture
def store() -> RunStore:
    opened = RunStore(os.environ["BLOCKVIZ_STORE"])
    yield opened
    opened.close()


@pytest.fixture
def runs(store: RunStore, real_runs: RealRuns) -> dict[str, int]:
    """A run per status: running, diverged and failed fakes, then a real completed one
    (the newest): status -> id."""
    statuses = [s for s in fakes.DEFAULT_STATUSES if s != "completed"]
    ids = fakes.populate(
        store, n_runs=3, n_steps=60, n_layer=2, probe_every=10, n_head=2, statuses=statuses
    )
    ids.append(copy_run(store, real_runs.path, real_runs.ids["pre"]))
    return {store.get_run(run_id).status: run_id for run_id in ids}


# ---------------------------------------------------------------------------- empty store


@pytest.mark.parametrize("page", ["live", "compare"])
def test_empty_store_says_what_to_do_next(page: str) -> None:
    at = _page(page).run()
    assert not at.exception
    assert not at.error
    assert any("Launch" in info.value for info in at.info)


# ---------------------------------------------------------------------------- Live


@pytest.mark.parametrize("status", fakes.DEFAULT_STATUSES)
def test_live_renders_every_tab_of_every_kind_of_run(
    store: RunStore, runs: dict[str, int], status: str
) -> None:
    run_id = runs[status]
    at = _live(run_id)
    newest_sample = store.samples(run_id, limit=1)["text"].iloc[0]
    for tab in LIVE_TABS:
        at.session_state["live.tab"] = tab
        at.run()
        assert not at.exception, (tab, [e.value for e in at.exception])
        # A chart that fails is caught by ui.guard and shown as st.error; only the run's
        # own status message may be an error here.
        expected_errors = 1 if status in ("diverged", "failed") else 0
        assert len(at.error) == expected_errors, (tab, [e.value for e in at.error])
        if tab == "Samples":
            assert set(_labels(at)) <= {CODE_LABEL}  # the header's, not the tab's
            assert any(code.value.strip() == newest_sample.strip() for code in at.code)
        else:
            assert set(_labels(at)) >= EXPORT_LABELS, tab
    assert any(c.value.startswith("Step ") for c in at.caption)  # the header's facts


def test_live_update_ratios_default_to_the_weight_matrices(
    store: RunStore, runs: dict[str, int]
) -> None:
    at = _live(runs["completed"])
    at.session_state["live.tab"] = "Updates"
    at.run()
    assert not at.exception
    (title,) = [t for t in _charts(at) if t.startswith("Update ratio")]
    assert "weight matrices only" in title
    frames = _charts(at)[title]
    data = next(f for f in frames if "log10_update_ratio" in f.columns)
    assert set(data["component"]) == {"weights"}
    assert not any("healthy" in caption.value for caption in at.caption)


def test_live_diverged_run_says_where_and_how(store: RunStore, runs: dict[str, int]) -> None:
    run_id = runs["diverged"]
    diverged_step = store.get_run(run_id).diverged_step
    at = _live(run_id).run()
    assert not at.exception
    # told once, as the findings panel's headline
    (message,) = [shown(e.value) for e in at.error]
    assert f"Diverged at step {diverged_step}." in message
    assert "last finite training loss" in message
    assert "train/loss = +inf" in message
    loss_frames = _charts(at)["Loss"]
    marks = [f for f in loss_frames if "label" in f.columns]
    assert any(f"diverged @ {diverged_step}" in label for f in marks for label in f["label"])


def test_live_failed_run_shows_its_error_and_log_tail(
    store: RunStore, runs: dict[str, int]
) -> None:
    run_id = runs["failed"]
    log = store.run_dir(run_id) / "train.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("step 1 loss 4.1\nTraceback (most recent call last):\nRuntimeError: boom\n")
    at = _live(run_id).run()
    assert not at.exception
    (message,) = [shown(e.value) for e in at.error]
    assert store.get_run(run_id).error in message
    assert any("RuntimeError: boom" in code.value for code in at.code)


def test_live_defaults_to_the_newest_run(runs: dict[str, int]) -> None:
    at = _page("live").run()
    assert not at.exception
    assert at.session_state["run_id"] == max(runs.values())


def test_live_run_deleted_while_open_gets_a_message(store: RunStore, runs: dict[str, int]) -> None:
    run_id = runs["completed"]
    at = _live(run_id).run()
    store.delete_run(run_id)
    at.run()
    assert not at.exception
    assert any(f"#{run_id}" in w.value and "deleted" in w.value for w in at.warning)
    assert at.session_state["run_id"] != run_id


def test_live_adds_rows_logged_since_the_last_refresh(
    store: RunStore, runs: dict[str, int]
) -> None:
    run_id = runs["running"]
    at = _live(run_id).run()
    last_step = int(store.scalars(run_id)["step"].max())
    new_steps = range(last_step + 1, last_step + 61)
    # One row at the newest step already drawn (a flush can land a step in parts), and 60
    # new steps at 4242 tokens/s: all must show up without re-reading the whole run.
    rows = [(last_step, "val/answer_acc", 0.25)]
    for step in new_steps:
        rows += [
            (step, "train/loss", 1.0),
            (step, "train/step_time", 0.5),
            (step, "train/tokens_per_sec", 4242.0),
        ]
    store.log_scalars(run_id, rows)
    store.flush()
    at.run()
    assert not at.exception
    (facts,) = [c.value for c in at.caption if c.value.startswith("Step ")]
    assert "4,242 tokens/s" in facts.split(" · ")
    cached = at.session_state["live.cache"]["scalars"]
    assert ((cached["name"] == "val/answer_acc") & (cached["step"] == last_step)).sum() == 1
    assert not cached.duplicated(["name", "step"]).any()
    loss_steps = pd.concat(_charts(at)["Loss"])["step"]
    assert loss_steps.max() == new_steps[-1]


# ---------------------------------------------------------------------------- Compare


def _config_run(store: RunStore, name: str, **overrides: object) -> int:
    run_config = cfg.replace(cfg.preset("tiny"), **overrides)
    return store.create_run(name, run_config.to_json(), status="completed")


def _diff_table(at: AppTest) -> pd.DataFrame:
    (table,) = [d.value for d in at.dataframe if list(d.value.columns)[:1] == ["field"]]
    return table


def test_compare_diff_shows_only_the_fields_that_differ(store: RunStore) -> None:
    pre = _config_run(store, "pre-ln")
    post = _config_run(store, "post-ln", norm_position="post", lr=3e-4)
    at = _page("compare")
    at.session_state["compare_ids"] = [pre, post]
    at.run()
    assert not at.exception
    table = _diff_table(at).set_index("field")
    assert set(table.index) == {"norm_position", "lr"}
    assert table.loc["norm_position"].tolist() == ["pre", "post"]
    assert table.loc["lr"].tolist() == [str(cfg.preset("tiny").train.lr), "0.0003"]


def test_compare_diff_of_three_runs_lists_fields_not_all_equal(store: RunStore) -> None:
    base = _config_run(store, "base")
    wider = _config_run(store, "wider", d_model=64)
    deeper = _config_run(store, "deeper", n_layer=3)
    at = _page("compare")
    at.session_state["compare_ids"] = [base, wider, deeper]
    at.run()
    assert not at.exception
    table = _diff_table(at).set_index("field")
    assert set(table.index) == {"d_model", "n_layer"}
    assert table.loc["n_layer"].tolist() == ["2", "2", "3"]


def test_compare_identical_configs_say_so(store: RunStore) -> None:
    ids = [_config_run(store, "a"), _config_run(store, "b")]
    at = _page("compare")
    at.session_state["compare_ids"] = ids
    at.run()
    assert not at.exception
    assert not [d for d in at.dataframe if list(d.value.columns)[:1] == ["field"]]
    assert any("identical" in s.value for s in at.success)


def test_compare_final_metrics_has_one_row_per_chosen_run(
    store: RunStore, runs: dict[str, int]
) -> None:
    chosen = [runs["completed"], runs["diverged"], runs["failed"]]
    at = _page("compare")
    at.session_state["compare_ids"] = chosen
    at.run()
    assert not at.exception
    assert not at.error
    (final,) = [d.value for d in at.dataframe if "steps" in d.value.columns]
    assert sorted(final["run"]) == sorted(store.get_run(i).name for i in chosen)
    diverged_row = final[final["run"] == store.get_run(runs["diverged"]).name]
    assert diverged_row["diverged_at"].iloc[0] == str(store.get_run(runs["diverged"]).diverged_step)
    completed_row = final[final["run"] == store.get_run(runs["completed"]).name]
    assert completed_row["diverged_at"].iloc[0] == ""  # blank, not "None"


def test_compare_defaults_to_the_latest_two_finished_runs(runs: dict[str, int]) -> None:
    # The newest runs are failed (3) and completed (4): the failed one is passed over for
    # the diverged run (2), which ran its course.
    at = _page("compare").run()
    assert not at.exception
    assert at.session_state["compare_ids"] == sorted([runs["diverged"], runs["completed"]])


def test_compare_offers_chart_downloads_and_the_report(runs: dict[str, int]) -> None:
    at = _page("compare")
    at.session_state["compare_ids"] = [runs["completed"], runs["running"]]
    at.run()
    assert not at.exception
    labels = _labels(at)
    assert set(labels) >= EXPORT_LABELS
    assert labels.count("Download report (zip)") == 1
    titles = list(_charts(at))
    assert "Loss" in titles
    assert any("initialization (step 0)" in t for t in titles)


def test_compare_with_nothing_chosen_asks_for_runs(runs: dict[str, int]) -> None:
    at = _page("compare")
    at.session_state["compare_ids"] = []
    at.run()
    assert not at.exception
    assert any("Pick one or more runs" in info.value for info in at.info)


def test_compare_gradient_by_layer_draws_step_zero_and_the_latest_common_step(
    store: RunStore, runs: dict[str, int]
) -> None:
    # completed reaches step 30, diverged stops earlier: the later chart uses a step both have.
    chosen = [runs["completed"], runs["diverged"]]
    common = set(store.layer_steps(chosen[0], "component", "grad_norm")) & set(
        store.layer_steps(chosen[1], "component", "grad_norm")
    )
    at = _page("compare")
    at.session_state["compare_ids"] = chosen
    at.run()
    assert not at.exception
    grads = {t: f for t, f in _charts(at).items() if t.startswith("Gradient norm by layer")}
    assert len(grads) == 2, list(grads)
    for frames in grads.values():
        data = pd.concat(frames)
        assert set(data["component"]) == {"block"}  # the default component only
        assert set(data["run_id"]) == set(chosen)
        assert data["step"].nunique() == 1
    steps = sorted(int(pd.concat(f)["step"].iloc[0]) for f in grads.values())
    assert steps == [0, max(common)]


def _fake_run(
    store: RunStore,
    name: str,
    probe_interval: int,
    status: str = "completed",
    step: int | None = None,
) -> int:
    """A 60-step, 2-block fake run probed every `probe_interval` steps (and at step 59)."""
    config = fakes.fake_config(
        n_layer=2,
        n_head=2,
        d_model=32,
        max_steps=60,
        warmup_steps=6,
        probe_interval=probe_interval,
        eval_interval=12,
        sample_interval=20,
    )
    run_id = fakes.add_run(store, config, status, step=step, name=name)
    store.flush()
    return run_id


def _subtitle(spec: dict) -> str:
    subtitle = spec["title"]["subtitle"]
    return subtitle if isinstance(subtitle, str) else " ".join(subtitle)


def test_compare_gradient_at_a_step_a_run_lacks_names_each_runs_real_step(
    store: RunStore,
) -> None:
    every_10 = _fake_run(store, "every-10", 10)  # probes 0, 10, ..., 50, 59
    every_25 = _fake_run(store, "every-25", 25)  # probes 0, 25, 50, 59
    started = _fake_run(store, "just-started", 10, status="running", step=5)  # probe 0 only
    at = _page("compare")
    at.session_state["compare_ids"] = [every_10, every_25, started]
    at.session_state["compare.grad_step"] = 30
    at.run()
    assert not at.exception
    assert not at.error
    title = "Gradient norm by layer at step 30"
    data = pd.concat(_charts(at)[title])
    # Each run at its own probe step, never its step 0 standing in for step 30.
    assert data.groupby("run")["step"].unique().map(list).to_dict() == {
        "every-10": [30],
        "every-25": [25],
    }
    spec = chart_specs(at)[title]
    legend = [
        entry for layer in spec["layer"] for entry in layer["encoding"]["color"]["scale"]["domain"]
    ]
    assert "every-25 (step 25)" in legend and "every-10" in legend
    assert "no probe at step 30" in _subtitle(spec)
    text = "\n".join(_captions(at))
    assert "No probe at step 30, so drawn at the nearest probe step: every-25 at step 25." in text
    assert "Left out, no probe after step 0 yet" in text and "just-started" in text
    # The initialization chart still draws all three at step 0.
    init = pd.concat(_charts(at)["Gradient norm by layer at initialization (step 0)"])
    assert set(init["run"]) == {"every-10", "every-25", "just-started"}
    assert set(init["step"]) == {0}


def test_compare_loss_axis_stops_short_of_a_blown_up_run_and_says_so(store: RunStore) -> None:
    healthy = _fake_run(store, "healthy", 10)
    blown = _fake_run(store, "blown-up", 10)
    train = store.scalars(blown, names="train/loss")
    later = train.loc[train["step"] >= 30, "step"]
    store.log_scalars(blown, [(int(s), "train/loss", 7.6e6) for s in later])
    store.flush()
    at = _page("compare")
    at.session_state["compare_ids"] = [healthy, blown]
    at.run()
    assert not at.exception
    assert not at.error
    spec = chart_specs(at)["Loss"]
    note = _subtitle(spec)
    assert "blown-up goes above it" in note and "healthy" not in note
    scales = [
        layer["encoding"]["y"]["scale"]
        for layer in spec["layer"]
        if "scale" in layer.get("encoding", {}).get("y", {})
    ]
    assert scales and all(scale["domainMax"] < 10 for scale in scales)
    # What the page sends (and the CSV download writes) is the raw loss, millions included.
    data = pd.concat(_charts(at)["Loss"])
    rows = data[(data["run"] == "blown-up") & (data["name"] == "train/loss")]
    assert (rows.loc[rows["step"] >= 30, "value"] == 7.6e6).all()


def _pre_and_post(store: RunStore, real_runs: RealRuns) -> list[int]:
    """Copies of the real Pre-LN and Post-LN runs (tiny preset, 2 blocks, 30 steps)."""
    return [copy_run(store, real_runs.path, real_runs.ids[label]) for label in ("pre", "post")]


def _captions(at: AppTest) -> list[str]:
    return [shown(caption.value) for caption in at.caption]


def test_compare_gradient_by_layer_says_only_what_the_runs_show(
    store: RunStore, real_runs: RealRuns
) -> None:
    chosen = _pre_and_post(store, real_runs)
    pre, post = (store.get_run(i).name for i in chosen)
    at = _page("compare")
    at.session_state["compare_ids"] = chosen
    at.run()
    assert not at.exception
    assert not at.error
    text = "\n".join(_captions(at))
    # The fixed claim over the measured chart is gone; the paper's is stated as a claim.
    assert "grow towards the last layers" not in text and "stay level" not in text
    assert "The paper's claim, not a measurement of the runs above: Xiong et al. 2020" in text
    # Sentences computed from the runs on screen, naming them and the step drawn.
    init = f"At initialization (step 0), {pre} (Pre-LN, 2 blocks): from the first block"
    assert init in text
    assert f"At initialization (step 0), {post} (Post-LN, 2 blocks):" in text
    grads = store.layer_stats(chosen, "component", "grad_norm", 0, component="block")
    last = {name: rows.set_index("layer")["value"][1] for name, rows in grads.groupby("run")}
    big, small = sorted(last, key=last.get, reverse=True)
    ratio = f"{last[big] / last[small]:.1f}×"
    assert f"the last block's gradient is {ratio} larger in {big} than in {small}" in text
    later = max(store.layer_steps(chosen[0], "component", "grad_norm"))
    assert f"At step {later}, {post} (Post-LN, 2 blocks):" in text  # the later chart's step


def test_compare_gradient_sentences_show_a_markdown_run_name_as_text(
    store: RunStore, real_runs: RealRuns
) -> None:
    chosen = _pre_and_post(store, real_runs)
    name = store.rename_run(chosen[1], "**bold** ![t](http://127.0.0.1:9/p.png) :red[x]")
    at = _page("compare")
    at.session_state["compare_ids"] = chosen
    at.run()
    assert not at.exception
    sentences = [c.value for c in at.caption if "(Post-LN, 2 blocks)" in shown(c.value)]
    assert sentences
    for markdown in sentences:
        assert name in shown(markdown)  # as typed, once the escapes are read
        assert "**bold**" not in markdown and "![t]" not in markdown and ":red[" not in markdown


def test_live_eta_is_the_same_estimate_the_train_page_shows(
    store: RunStore, runs: dict[str, int]
) -> None:
    from blockviz.dashboard import ui
    from blockviz.launch import runner

    run_id = runs["running"]
    at = _live(run_id).run()
    assert not at.exception
    (facts,) = [c.value for c in at.caption if c.value.startswith("Step ")]
    (active,) = [r for r in runner.active(store) if r.id == run_id]
    assert active.eta_s is not None
    assert f"ETA {ui.format_duration(active.eta_s)}" in facts.split(" · ")


# ---------------------------------------------------------------------------- ?run= names


@pytest.mark.parametrize("page", ["live", "runs"])
@pytest.mark.parametrize("param", ["²", "٣", "abc", "-1", "1.5"])
def test_a_run_param_that_is_not_an_id_is_a_clear_message(
    runs: dict[str, int], page: str, param: str
) -> None:
    at = _page(page)
    at.query_params["run"] = param
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    warnings = [shown(w.value) for w in at.warning]
    assert any(w.startswith(f"?run={param}: not a run id") for w in warnings), warnings
    newest = max(runs.values())
    assert at.session_state["run_id"] == newest  # the newest run is shown instead


@pytest.mark.parametrize("page", ["live", "runs"])
def test_a_run_id_that_does_not_exist_says_so(runs: dict[str, int], page: str) -> None:
    at = _page(page)
    at.query_params["run"] = "999"
    at.run()
    assert not at.exception
    warnings = [shown(w.value) for w in at.warning]
    assert any("Run #999 is not in this store" in w for w in warnings), warnings
    assert at.session_state["run_id"] == max(runs.values())


@pytest.mark.parametrize("page", ["live", "runs"])
@pytest.mark.parametrize("digits", [4301, 5000, 20])
def test_a_run_id_of_any_length_is_not_in_this_store(
    store: RunStore, page: str, digits: int
) -> None:
    """Past 4,300 digits int() refuses the text; past 19 no SQLite id holds it."""
    newest = fakes.populate(store, n_runs=2, n_steps=20, n_layer=1, probe_every=10)[-1]
    at = _page(page)
    at.query_params["run"] = "9" * digits
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    warnings = [shown(w.value) for w in at.warning]
    assert not at.error, [e.value for e in at.error]
    assert any("is not in this store" in w for w in warnings), warnings
    assert all(len(w) < 300 for w in warnings), warnings  # the digits are not all echoed
    assert at.session_state["run_id"] == newest


def test_a_run_param_with_spaces_around_the_id_names_that_run(runs: dict[str, int]) -> None:
    at = _page("live")
    at.query_params["run"] = f" {runs['completed']} "
    at.run()
    assert not at.exception and not at.warning
    assert at.session_state["run_id"] == runs["completed"]


# ---------------------------------------------------------------------------- fresh statuses


def rerun_fragments(at: AppTest, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    """Rerun only the page's fragments, as their run_every timer does in a browser.

    AppTest has no timer; a rerun request naming the fragments registered by the last
    full run does the same. The tree then holds only what the fragments drew, unless
    they asked for a full rerun.
    """
    from streamlit.testing.v1 import local_script_runner

    fragment_ids = list(at._fragment_storage._fragments)
    assert fragment_ids, "the page drew no fragment"
    plain_rerun = local_script_runner.RerunData
    with monkeypatch.context() as patch:
        patch.setattr(
            local_script_runner,
            "RerunData",
            lambda **kwargs: plain_rerun(
                **kwargs, fragment_id_queue=fragment_ids, is_auto_rerun=True
            ),
        )
        at.run()
    return at


def _badges(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "-badge[" in m.value]


def dead_pid() -> int:
    """The pid of a process that has exited (and been waited for)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_live_picker_and_header_show_the_status_of_the_same_fresh_read(
    store: RunStore, runs: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = runs["running"]
    name = store.get_run(run_id).name
    store.update_run(run_id, status="queued")
    at = _live(run_id).run()
    picker = at.selectbox(key="live.run")
    # No other run is running, so its slot is free: picker and header say it is starting.
    assert f"#{run_id} {name} (starting)" in picker.options
    assert _badges(at) == [":blue-badge[starting]"]

    store.update_run(run_id, status="running")  # the run got its slot
    rerun_fragments(at, monkeypatch)
    assert not at.exception
    # The browser keeps what a fragment rerun does not redraw: the picker of the last full
    # run, unless the page reran in full.
    shown_picker = next((s for s in at.selectbox if s.key == "live.run"), picker)
    assert f"#{run_id} {name} (running)" in shown_picker.options
    assert _badges(at) == [":blue-badge[running]"]


def _kill(store: RunStore, run_id: int) -> None:
    """What kill -9 leaves behind: status running, a pid that is gone, a stale heartbeat."""
    store.update_run(run_id, pid=dead_pid(), heartbeat=time.time() - 60)
    store.flush()


APP = str(PAGES.parent / "app.py")


@pytest.mark.parametrize("page", ["train", "live", "compare", "runs"])
def test_a_killed_run_reads_failed_after_one_render_of_any_page(
    store: RunStore, runs: dict[str, int], page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_access, "_last_reap", {}, raising=False)
    run_id = runs["running"]
    name = store.get_run(run_id).name
    _kill(store, run_id)
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["run_id"] = run_id
    at.session_state["compare_ids"] = [run_id]
    at.switch_page(f"pages/{page}.py").run()  # the first page this session opens
    assert not at.exception, [e.value for e in at.exception]
    assert store.get_run(run_id).status == "failed"
    if page == "train":
        assert not [b for b in at.get("progress") if f"#{run_id}" in b.proto.text]
    elif page == "live":
        assert _badges(at) == [":red-badge[failed]"]
        assert f"#{run_id} {name} (failed)" in at.selectbox(key="live.run").options
    elif page == "compare":
        assert f"#{run_id} {name} (failed)" in at.multiselect(key="compare.runs").options
        (final,) = [d.value for d in at.dataframe if "steps" in d.value.columns]
        assert final["status"].tolist() == ["failed"]
    else:
        table = at.dataframe[0].value.set_index("id")
        assert table.loc[run_id, "status"] == "failed"


@pytest.mark.parametrize("page", ["train", "live", "compare"])
def test_a_run_killed_while_a_page_refreshes_reads_failed_on_the_next_refresh(
    store: RunStore, runs: dict[str, int], page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = runs["running"]
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["run_id"] = run_id
    at.session_state["compare_ids"] = [run_id]
    at.switch_page(f"pages/{page}.py").run()
    assert store.get_run(run_id).status == "running"
    _kill(store, run_id)
    monkeypatch.setattr(store_access, "REAP_EVERY_S", 0.0, raising=False)  # the 5 s have passed
    rerun_fragments(at, monkeypatch)
    assert not at.exception, [e.value for e in at.exception]
    assert store.get_run(run_id).status == "failed"
    if page == "live":
        assert _badges(at) == [":red-badge[failed]"]
    elif page == "train":
        assert not [b for b in at.get("progress") if f"#{run_id}" in b.proto.text]


def test_reaping_is_throttled_and_never_writes_a_read_only_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    class Store:
        def __init__(self, path: str, readonly: bool) -> None:
            self.path, self.readonly = Path(path), readonly
            self.where = str(self.path)

        def reap_dead(self) -> list[int]:
            calls.append(str(self.path))
            return []

    monkeypatch.setattr(store_access, "_last_reap", {})
    writable, readonly = Store("a.db", False), Store("b.db", True)
    for _ in range(3):
        store_access.reap_dead(writable)
        store_access.reap_dead(readonly)
    assert calls == ["a.db"]  # once per REAP_EVERY_S, and never the read-only store
    monkeypatch.setattr(store_access, "REAP_EVERY_S", 0.0)
    store_access.reap_dead(writable)
    assert calls == ["a.db", "a.db"]


def test_a_built_report_stays_offered_as_an_ordinary_download(runs: dict[str, int]) -> None:
    # The same bytes, name and type as the click's generated file: that keeps the click's
    # download from being dropped by Streamlit before the browser fetches it.
    from blockviz.views.export.report_job import ReportJob

    chosen = sorted([runs["completed"], runs["diverged"]])
    job = ReportJob()
    job.builder(lambda progress: b"PK built", chosen)()
    at = _page("compare")
    at.session_state["compare_ids"] = chosen
    at.session_state["compare.report_job"] = job
    at.run()
    assert not at.exception
    assert "Save the report again" in _labels(at)
    assert any("Report built" in str(s.value) for s in at.success)


# ---------------------------------------------------------------------------- one read per refresh


def _warming_run(store: RunStore) -> int:
    """A running run (this process stands in for its trainer) with nothing logged yet."""
    config = fakes.fake_config(n_layer=2, n_head=2, d_model=32, max_steps=100)
    now = time.time()
    return store.create_run(
        "warming",
        config.to_json(),
        status="running",
        pid=os.getpid(),
        pid_started=fakes._own_start(),
        started=now,
        heartbeat=now,
        step=0,
    )


def _headline(at: AppTest) -> str:
    boxes = [*at.info, *at.success, *at.warning, *at.error]
    return " ".join(shown(box.value) for box in boxes)


def test_live_header_and_findings_headline_read_the_same_step(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blockviz.views import run_findings

    # Findings of a running run are read again only every so often; make that never here,
    # so the page must not lean on the timer to agree with itself.
    monkeypatch.setattr(run_findings, "ACTIVE_EVERY_S", 3600.0)
    run_id = _warming_run(store)
    at = _live(run_id).run()
    assert not at.exception
    assert "No loss yet" in _headline(at)
    # 25 steps logged; the row's step is written after its rows, so it still says 0.
    store.log_scalars(run_id, [(step, "train/loss", 4.3 - 0.01 * step) for step in range(25)])
    store.flush()
    at.run()
    assert not at.exception
    (facts,) = [c.value for c in at.caption if c.value.startswith("Step ")]
    assert facts.startswith("Step 24 of 100")  # the newest logged step, as the chart shows
    headline = _headline(at)
    assert "No loss yet" not in headline  # not beside a loss chart with points
    assert "at step 24" in headline and "Findings as of step 24," in headline


def test_show_scrolls_the_charts_into_view_once(store: RunStore) -> None:
    (run_id,) = fakes.populate(store, n_runs=1, n_steps=60, n_layer=2, n_head=2)

    def scripts(at: AppTest) -> list[str]:
        return [e.proto.body for e in at.get("html") if "scrollIntoView" in e.proto.body]

    at = _live(run_id).run()
    assert not scripts(at)  # opening the page scrolls nowhere
    next(b for b in at.button if b.label == "Show").click().run()
    assert not at.exception
    (script,) = scripts(at)
    assert ".st-key-live-charts" in script  # the container of the tabs
    assert "'live-charts:1'" in script
    # A refresh sends the same click's scroll again, which the browser has done already (it
    # scrolls once per click): a run cut short before it was drawn no longer loses it.
    at.run()
    assert scripts(at) == [script]
    next(b for b in at.button if b.label == "Show").click().run()
    (again,) = scripts(at)
    assert "'live-charts:2'" in again  # a second click scrolls again


def test_live_attention_map_labels_its_axes_with_the_probe_characters(store: RunStore) -> None:
    from blockviz.views.charts.attention import visible_char

    (run_id,) = fakes.populate(store, n_runs=1, n_steps=60, n_layer=2, n_head=2)
    at = _live(run_id)
    at.session_state["live.tab"] = "Attention"
    at.run()
    assert not at.exception
    step = store.attention_steps(run_id)[-1]
    stored = store.attention(run_id, step, layer=0)
    queries = stored.drop_duplicates("query").sort_values("query")
    expected = [visible_char(str(c)) for c in queries["query_char"]]
    exprs = [
        expr
        for element in at.get("vega_lite_chart")
        for expr in re.findall(r'"labelExpr": ("(?:[^"\\]|\\.)*")', element.proto.spec)
    ]
    assert exprs, "no attention map with labelled axes on the Attention tab"
    # The y axis reads the probe text, one character per row.
    wanted = f"{json.dumps(expected, ensure_ascii=False)}[datum.value]"
    assert wanted in [json.loads(expr) for expr in exprs]


@pytest.mark.parametrize("status", ["queued", "running"])
def test_live_draws_a_run_with_no_step_yet_as_waiting_without_an_error(
    store: RunStore, status: str
) -> None:
    """Issue 35, 8: right after Launch the loss chart (the one a click picks a step on)
    has no point; it says so instead of Streamlit's "Selections are activated" error."""
    (run_id,) = fakes.populate(store, n_runs=1, n_layer=2, statuses=["queued"])
    store.update_run(run_id, status=status)
    at = _live(run_id).run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    drawn = pd.concat(_charts(at)["Loss"])
    assert list(drawn["message"].dropna()) == ["waiting for the first step"]
    assert not [b for b in at.download_button if b.label in EXPORT_LABELS]  # nothing to export


def test_a_run_link_opens_its_run_in_a_session_that_showed_another(runs: dict[str, int]) -> None:
    """Issue 35, 10: a link to a run (`?run=ID`, as Live's fork notice gives) shows that
    run, though the session had another selected (it kept the parent before)."""
    at = _live(runs["completed"])
    at.query_params["run"] = str(runs["running"])
    at.run()
    assert not at.exception
    assert at.session_state["run_id"] == runs["running"]
    assert shown(at.subheader[0].value).startswith(f"#{runs['running']} ")
