"""AppTest of the Studies page: empty store, a constructed study, a tiny sweep end to end."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core import evaluation, hardware
from blockviz.core.studies import builtins, define, sweeps
from blockviz.core.studies.outcomes import results_frame
from blockviz.core.studies.verdicts import judge
from blockviz.dashboard.studies.launch import duration
from blockviz.dashboard.studies.view import VERDICT_ICONS
from blockviz.launch import study_estimate
from blockviz.store import RunStore
from blockviz.views.studies import table as study_table
from tests.helpers import fake_study

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "pages" / "studies.py"


def _page() -> AppTest:
    return AppTest.from_file(str(PAGE), default_timeout=60)


def _text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += [e.value for e in at.error] + [i.value for i in at.info]
    return "\n".join(str(p) for p in parts)


def test_an_empty_store_offers_the_builtin_studies() -> None:
    at = _page().run()
    assert not at.exception
    assert "No studies yet" in _text(at)
    assert at.selectbox(key="studies.key").value == builtins.STUDY_KEYS[0]
    assert any(b.label == "Run study" for b in at.button)
    at.selectbox(key="studies.key").set_value("activation").run()
    text = _text(at)
    assert "GELU does at least as well as ReLU" in text.replace("\\", "")
    assert "4 variants × 2 seeds (1–2) = 8 runs" in text
    assert "Estimated time here" in text
    # The estimate says what it rests on: with nothing measured yet, a rough guess; workers
    # at once, threads each.
    assert "from a rough guess: no completed run in this store measured" in text
    assert "worker(s) at once" in text and " each, " in text


def test_on_a_gpu_the_launchers_offer_more_seeds_and_say_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34: where a GPU is visible both launchers start at `define.GPU_SEEDS` seeds
    and their captions say why; on a CPU (the test above) the sizes' own counts, no note."""
    monkeypatch.setattr(hardware, "visible_gpus", lambda: 1)
    at = _page().run()
    at.selectbox(key="studies.key").set_value("activation").run()
    assert not at.exception
    assert at.text_input(key="studies.seeds.quick").value == str(define.GPU_SEEDS)
    assert at.text_input(key="studies.sweep.seeds").value == str(define.GPU_SEEDS)
    text = _text(at).replace("\\", "")
    assert f"4 variants × {define.GPU_SEEDS} seeds (1–{define.GPU_SEEDS}) = " in text
    note = define.seeds_note()
    assert text.count(note[0].upper() + note[1:]) == 2  # the built-in's and the sweep's
    monkeypatch.setattr(hardware, "visible_gpus", lambda: 0)
    at = _page().run()
    assert at.text_input(key="studies.sweep.seeds").value == "2"
    assert "on a GPU" not in _text(at) and "On a GPU" not in _text(at)


def test_the_builtin_the_launcher_leaves_out_is_named_with_where_it_lives() -> None:
    at = _page().run()
    offered = at.selectbox(key="studies.key").options
    left_out = [k for k in builtins.STUDY_KEYS if not any(o.startswith(f"{k} — ") for o in offered)]
    assert left_out == ["init-gradients"]  # it measures at initialisation; nothing to train
    (note,) = [c.value for c in at.caption if "init-gradients" in c.value]
    # The page it names is the app's "Gradients at init" (pages/init_grads.py).
    assert '"pages/init_grads.py", title="Gradients at init"' in (ROOT / "app.py").read_text()
    assert "**Gradients at init** page" in note
    assert "`.venv/bin/python -m blockviz study run init-gradients`" in note


def test_the_time_estimate_is_the_captions_only_time_and_says_what_it_assumes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a store whose runs of its shapes took 2 s a step, quick norm-position takes
    hours here: the caption says so and no "minutes on a laptop" beside it, nor the size's
    default seed count beside the seeds chosen; the estimate names its pace, slots and load."""
    monkeypatch.setenv(hardware.ENV_SLOTS, "2")
    plan = builtins.builtin("norm-position", "quick", 3)
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        for variant, seed, config in plan.grid():
            if seed == 1:
                run_id = store.create_run(f"slow {variant}", config.to_json(), status="completed")
                store.update_run(run_id, step=300, final={"time_s": 600.0})
        pace = study_estimate.measured_pace(store)
    assert pace.runs == 6
    at = _page().run()
    at.selectbox(key="studies.key").set_value("norm-position").run()
    at.text_input(key="studies.seeds.quick").set_value("3").run()
    assert not at.exception
    expected = duration(study_estimate.estimate_s(plan, pace, 2))
    assert expected == "about 1.5 h"  # 18 runs of 600.5 s on 2 workers, after 6 s
    (caption,) = [c.value for c in at.caption if "Estimated time here" in c.value]
    caption = caption.replace("\\", "")
    assert caption.startswith("6 variants × 3 seeds (1–3) = 18 runs; ")
    assert f"Estimated time here: {expected} (from the pace this store's last 6" in caption
    assert "laptop" not in caption and "minutes" not in caption and "2 seeds" not in caption
    assert "18 of its 18 runs have a measured run of their shape" in caption
    assert (
        "no other run training here meanwhile: 2 run(s) may train at once "
        "(BLOCKVIZ_MAX_RUNNING=2), and a study's run waits for a free slot" in caption
    )


def test_a_finished_study_shows_its_computed_verdicts_and_table() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        study_id = fake_study(store)
        plan = define.plan_from_spec(store.get_study(study_id).spec)
        expected = judge(plan.claims[0], results_frame(store.study_runs(study_id), plan), plan)
    at = _page().run()
    assert not at.exception
    text = _text(at).replace("\\", "")
    assert expected.verdict.capitalize() in text
    assert expected.reason in text
    # Both intervals of GELU minus ReLU (the same seeds ran both, so they pair up).
    (intervals,) = study_table.interval_lines(expected)
    assert intervals.startswith("GELU minus ReLU: paired ") and intervals in text
    (table,) = [d.value for d in at.dataframe if "Variant" in d.value.columns]
    assert len(table) == 4
    assert any(b.label == "Resume study" and b.disabled for b in at.button)
    # Its runs carry no evaluation record: scored on their own seed's windows, and it says so.
    (warning,) = [w.value for w in at.warning]
    assert warning.startswith("8 of 8 finished runs were scored on validation windows drawn")


def test_the_launcher_takes_a_seed_range_and_names_a_bad_one() -> None:
    at = _page().run()
    at.selectbox(key="studies.key").set_value("activation").run()
    at.text_input(key="studies.seeds.quick").set_value("5-8").run()
    assert not at.exception
    assert "4 variants × 4 seeds (5–8) = 16 runs" in _text(at).replace("\\", "")
    at.text_input(key="studies.seeds.quick").set_value("5,6,5").run()
    (error,) = [e.value.replace("\\", "") for e in at.error]
    assert error == "seeds: '5,6,5' names seed 5 twice"
    assert not any(b.label == "Run study" for b in at.button)


def test_a_study_shows_each_seed_set_its_replication_and_the_seeds_it_needs() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        first = fake_study(store, seeds="1-2")
        second = fake_study(store, seeds="3-4")
    at = _page().run()
    at.selectbox(key="studies.show").set_value(first).run()
    assert not at.exception
    text = _text(at).replace("\\", "")
    assert f"seed sets of this definition: seeds 1–2 (study {first}, this one); seeds 3–4 " \
        f"(study {second})" in text  # fmt: skip
    assert f"seeds 1–2 (study {first}): " in text and f"seeds 3–4 (study {second}): " in text
    assert "seeds needed: " in text and "Run them on fresh seeds" in text
    (command,) = [c.value for c in at.get("code")]
    # fresh seeds after the highest either set used (4)
    assert re.search(r" study run activation --size quick --seeds 5-\d+$", command), command


def test_a_study_scored_on_one_evaluation_set_gives_no_scoring_warning() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        fake_study(store, scored=evaluation.record(160, 64))
    at = _page().run()
    assert not at.exception
    assert not [w.value for w in at.warning if "evaluation" in str(w.value)]


def test_a_huge_sweep_from_the_form_is_refused_without_building_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_variant(*args: object) -> None:
        raise AssertionError("the sweep built a variant of a grid it refuses")

    monkeypatch.setattr(sweeps, "Variant", no_variant)
    at = _page().run()
    at.text_input(key="studies.sweep.values0").set_value("1e-4:1e-1:50")
    at.selectbox(key="studies.sweep.field1").set_value("dropout")
    at.text_input(key="studies.sweep.values1").set_value("1e-3:0.5:50")
    at.text_input(key="studies.sweep.seeds").set_value("20")
    at.button(key="FormSubmitter:studies.sweep-Run sweep").click().run()
    assert not at.exception, [e.value for e in at.exception]
    (error,) = [e.value.replace("\\", "") for e in at.error]
    assert error == (
        "sweep: 50 lr × 50 dropout × 20 seeds = 50,000 runs, more than the 500 a study may "
        "hold; sweep fewer values or seeds"
    )
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        assert store.studies_frame().empty


@pytest.mark.slow
def test_a_tiny_sweep_from_the_form_runs_to_its_results() -> None:
    at = _page().run()
    at.text_input(key="studies.sweep.values0").set_value("1e-3,3e-3")
    at.text_input(key="studies.sweep.seeds").set_value("2")
    at.number_input(key="studies.sweep.steps").set_value(20)
    at.button(key="FormSubmitter:studies.sweep-Run sweep").click().run()
    assert not at.exception
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        (study_id,) = store.studies_frame()["id"].tolist()
        assert len(store.study_runs(study_id)) == 4
        deadline = time.monotonic() + 180
        while store.get_study(study_id).status == "running" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert store.get_study(study_id).status == "completed"
        assert set(store.study_runs(study_id)["status"]) <= {"completed", "diverged"}
    at.run()
    assert not at.exception
    (listed,) = [d.value for d in at.dataframe if "runs done" in d.value.columns]
    assert "4/4" in listed["runs done"].tolist()
    (table,) = [d.value for d in at.dataframe if "Variant" in d.value.columns]
    assert len(table) == 2  # one row per variant
    assert at.get("vega_lite_chart")  # the curves, and final loss against lr


def _in_order(node) -> list:
    """Every element under `node`, in the order the page draws them."""
    children = getattr(node, "children", None)
    if not children:
        return [node]
    return [leaf for key in sorted(children) for leaf in _in_order(children[key])]


def test_a_studys_verdicts_and_chart_come_first_then_its_details_then_the_launchers() -> None:
    """Issue 35, 11: the results sat 2.4 screens down, under the launchers and the studies
    table; now the picked study's verdicts and its chart lead the page."""
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        fake_study(store)
    at = _page().run()
    assert not at.exception
    drawn = _in_order(at.main)

    def first(kind: str, *says: str) -> int:
        texts = [str(getattr(e, "value", "")) if e.type == kind else None for e in drawn]
        return next(i for i, t in enumerate(texts) if t is not None and any(s in t for s in says))

    verdict = first("markdown", *VERDICT_ICONS.values())
    chart = next(i for i, e in enumerate(drawn) if e.type == "vega_lite_chart")
    results = first("subheader", "Results")
    launcher = next(i for i, e in enumerate(drawn) if getattr(e, "label", "") == "Run study")
    assert verdict < chart < results < launcher
