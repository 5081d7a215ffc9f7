"""A study's charts as a reader sees them: tall enough to read, every variant one colour
and dash of its own (the same wherever it is drawn), seed bands fainter than the lines."""

from __future__ import annotations

import colorsys
import functools
from typing import Any

import pandas as pd
import pytest

from blockviz.core.studies import builtins, define
from blockviz.core.studies.outcomes import swept_value
from blockviz.views import charts
from blockviz.views.studies import charts as study_charts
from blockviz.views.studies import report as study_report

MIN_HEIGHT = 360  # Streamlit fits title, axes and legend into it: ~140 px of plot at 280


@functools.cache
def study_frames(key: str, seeds: int = 2) -> tuple[define.StudyDef, pd.DataFrame, pd.DataFrame]:
    """A built-in study's plan, a finished results frame and val-loss curves for it:
    constructed, neutral numbers (every variant the same up to the seed). Read, never
    change: one copy serves every test."""
    plan = builtins.builtin(key, "quick", seeds)
    rows, scalars = [], []
    run_id = 0
    for variant in plan.variants:
        swept = {field: swept_value(plan, variant.label, field) for field in plan.swept}
        for seed in plan.seeds:
            run_id += 1
            loss = 2.0 + 0.01 * seed
            rows.append(
                {
                    "run_id": run_id,
                    "variant": variant.label,
                    "seed": seed,
                    "status": "completed",
                    "outcome": "converged",
                    "val_loss": loss,
                    **swept,
                }
            )
            curve = ((0, 4.2), (100, 3.0 + 0.01 * seed), (300, loss))
            scalars += [
                {
                    "run_id": run_id,
                    "run": f"r{run_id}",
                    "step": step,
                    "name": "val/loss",
                    "value": v,
                }
                for step, v in curve
            ]
    return plan, pd.DataFrame(rows), pd.DataFrame(scalars)


def layers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec.get("layer", [spec])


def mark_of(layer: dict[str, Any]) -> dict[str, Any]:
    mark = layer["mark"]
    return mark if isinstance(mark, dict) else {"type": mark}


def hue(colour: str) -> float:
    red, green, blue = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hsv(red, green, blue)[0]


def colour_scale(spec: dict[str, Any]) -> dict[str, Any]:
    (scale,) = {
        str(layer["encoding"]["color"]["scale"]): layer["encoding"]["color"]["scale"]
        for layer in layers(spec)
        if "color" in layer.get("encoding", {})
    }.values()
    return scale


@pytest.mark.parametrize("key", ["activation", "lr-sensitivity", "norm-position"])
def test_study_charts_are_tall_enough_to_read_with_the_whole_legend(key: str) -> None:
    plan, results, scalars = study_frames(key)
    curves = study_charts.curves_chart(scalars, results, plan.swept).to_dict()
    assert curves["height"] >= MIN_HEIGHT
    assert curves["height"] >= 18 * len(plan.variants)  # every variant's legend row fits
    for _, chart in study_report.swept_charts(results, plan):
        assert chart.to_dict()["height"] >= MIN_HEIGHT


TRAINING_STUDIES = [k for k in builtins.STUDY_KEYS if builtins.builtin(k, "quick").trains]


@pytest.mark.parametrize("key", TRAINING_STUDIES)
def test_each_variant_has_a_colour_and_dash_of_its_own_in_the_studys_order(key: str) -> None:
    plan, results, scalars = study_frames(key)
    labels = [v.label for v in plan.variants]
    spec = study_charts.curves_chart(scalars, results, plan.swept).to_dict()
    colours = colour_scale(spec)
    assert colours["domain"] == labels  # explicit: no theme or data order can reshuffle it
    (dashes,) = [
        layer["encoding"]["strokeDash"]["scale"]
        for layer in layers(spec)
        if "strokeDash" in layer.get("encoding", {})
    ]
    assert dashes["domain"] == labels
    assert len(set(colours["range"])) == len(labels)  # no two lines drawn alike
    # A variant keeps its colour while the study fills in: a chart of the first runs alone
    # draws the variants it has in the colours the finished study gives them.
    early = study_charts.curves_chart(scalars[scalars["run_id"] <= 4], results, plan.swept)
    assert colour_scale(early.to_dict()) == colours


def test_a_family_of_variants_shares_a_hue_and_its_swept_chart_line_that_hue() -> None:
    """lr-sensitivity: Pre-LN, Post-LN and no norm each a hue (shades by lr) and a dash,
    and the final-loss chart draws pre, post and none in those hues."""
    plan, results, _ = study_frames("lr-sensitivity")
    styles = study_charts.variant_styles(results, plan.swept)
    pre = [styles[v.label] for v in plan.variants if v.label.startswith("Pre-LN")]
    post = [styles[v.label] for v in plan.variants if v.label.startswith("Post-LN")]
    assert len({dash for _, dash in pre}) == 1 and pre[0][1] != post[0][1]
    ((_, swept),) = study_report.swept_charts(results, plan)
    groups = colour_scale(swept.to_dict())
    assert groups["domain"] == ["pre", "post", "none"]
    assert groups["range"] == list(charts.PALETTE[:3])
    for family, base in ((pre, groups["range"][0]), (post, groups["range"][1])):
        assert all(abs(hue(colour) - hue(base)) < 0.02 for colour, _ in family)
        assert len({colour for colour, _ in family}) == 7  # a shade per learning rate


def test_a_line_per_family_never_averages_two_variants() -> None:
    """norm-position's final loss against depth: Post-LN and Post-LN + warm-up are two
    lines, not one 'post' line through both."""
    plan, results, _ = study_frames("norm-position")
    ((stem, chart),) = study_report.swept_charts(results, plan)
    assert stem == "final-loss-vs-n_layer"
    assert colour_scale(chart.to_dict())["domain"] == ["post · off", "post · on", "pre · off"]


def test_seed_bands_lie_behind_the_lines_and_fainter() -> None:
    plan, results, scalars = study_frames("activation")
    drawn = layers(study_charts.curves_chart(scalars, results, plan.swept).to_dict())
    kinds = [mark_of(layer)["type"] for layer in drawn]
    assert kinds.index("area") < kinds.index("line")  # drawn first, so under the lines
    band = mark_of(drawn[kinds.index("area")])
    line = mark_of(drawn[kinds.index("line")])
    assert band["opacity"] <= 0.15 < line.get("opacity", 1.0)
    assert line["strokeWidth"] >= 2


def test_the_final_loss_chart_draws_the_seeds_spread_behind_the_means() -> None:
    """Final loss against lr: per side and value, a band from the lowest to the highest
    seed that trained (diverged and blown-up runs left out, as from the mean), under the
    mean's line and fainter."""
    plan, results, _ = study_frames("lr-sensitivity")
    ((_, swept),) = study_report.swept_charts(results, plan)
    drawn = layers(swept.to_dict())
    kinds = [mark_of(layer)["type"] for layer in drawn]
    assert kinds.index("area") < kinds.index("line")
    band = drawn[kinds.index("area")]
    assert mark_of(band)["opacity"] <= 0.15
    (aggregate,) = [t for t in band["transform"] if "aggregate" in t]
    assert {a["op"] for a in aggregate["aggregate"]} == {"min", "max"}
    assert aggregate["groupby"] == ["lr", "group"]
    filters = [t["filter"] for t in band["transform"] if "filter" in t]
    assert filters == ["datum.outcome != 'diverged' && datum.outcome != 'blew up'"]
