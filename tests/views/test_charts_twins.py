"""A twin's difference frame and chart; the loss chart's step picker."""

from types import SimpleNamespace

import pandas as pd

from blockviz.core import spec
from blockviz.views import charts
from blockviz.views.charts.marks import STEP_PICK, defines_param, picked_step, with_step_picker
from blockviz.views.charts.twins import TWIN_METRICS, difference_chart, differences
from tests.helpers import scalars_frame

LOSS = TWIN_METRICS[0]
PER_HEAD = next(m for m in TWIN_METRICS if m.kind == "head")


def _scalars(values: dict[int, float], run: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"run_id": run, "run": f"r{run}", "step": list(values), "name": spec.TRAIN_LOSS}
        | {"value": list(values.values())}
    )


def test_differences_start_at_the_fork_step_and_subtract_the_parent() -> None:
    parent = _scalars({0: 4.0, 5: 3.0, 10: 2.5, 15: 2.0}, 1)
    twin = _scalars({0: 4.0, 5: 3.0, 10: 2.25, 15: 2.5}, 2)
    frame = differences(parent, twin, 10, LOSS, n_layer=2)
    assert frame["step"].tolist() == [10, 15]
    assert frame["difference"].tolist() == [-0.25, 0.5]
    assert set(frame["series"]) == {spec.TRAIN_LOSS}


def test_head_differences_are_one_series_per_block_and_head() -> None:
    def rows(run: int, bump: float) -> pd.DataFrame:
        return pd.DataFrame(
            [
                (run, step, layer, "head", str(head), PER_HEAD.stat, 1.0 + bump * step * head)
                for step in (0, 10, 20)
                for layer in (0, 1)
                for head in (0, 1)
            ],
            columns=["run_id", "step", "layer", "kind", "component", "stat", "value"],
        )

    frame = differences(rows(1, 0.0), rows(2, 0.1), 10, PER_HEAD, n_layer=2)
    assert set(frame["series"]) == {
        "block 0 head 0",
        "block 0 head 1",
        "block 1 head 0",
        "block 1 head 1",
    }
    head1 = frame[frame["series"] == "block 1 head 1"]
    assert head1["difference"].round(6).tolist() == [1.0, 2.0]
    assert (frame[frame["series"] == "block 0 head 0"]["difference"] == 0).all()


def test_a_difference_chart_carries_its_frame_and_says_when_empty() -> None:
    frame = differences(_scalars({10: 2.0}, 1), _scalars({10: 2.5}, 2), 10, LOSS, 2)
    chart = difference_chart(frame, LOSS, "twin", "parent")
    assert charts.chart_data(chart)["difference"].tolist() == [0.5]
    assert "twin − parent" in chart.to_dict()["title"]
    empty = difference_chart(frame.iloc[0:0], LOSS, "twin", "parent")
    assert charts.chart_data(empty).empty


def test_the_step_picker_selects_the_nearest_drawn_step() -> None:
    chart = charts.loss_chart(scalars_frame(steps=30), 0.0, False)
    picked = with_step_picker(chart, charts.STEP_AXIS)
    params = picked.to_dict()["params"]  # Altair lifts a layer's params to the top
    assert any(p["name"] == STEP_PICK and p["select"]["nearest"] for p in params)
    assert picked_step(SimpleNamespace(selection={STEP_PICK: [{"step": 12}]})) == 12
    assert picked_step(SimpleNamespace(selection={})) is None
    assert picked_step(None) is None
    assert defines_param(picked, STEP_PICK)


def test_an_empty_chart_gets_no_step_picker_and_says_it_has_none() -> None:
    """What `ui.chart_with_downloads` asks before it turns on a selection (issue 35, 8)."""
    empty = with_step_picker(charts.loss_chart(scalars_frame(steps=30).iloc[0:0]), charts.STEP_AXIS)
    assert not defines_param(empty, STEP_PICK)
