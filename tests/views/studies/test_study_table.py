"""A study's results table, verdicts table and swept chart on constructed results: how each
run ended and both intervals of a verdict reach what a reader sees."""

from __future__ import annotations

import math

from blockviz.core.studies.summary import summarize
from blockviz.core.studies.verdicts import judge
from blockviz.views.studies import charts as study_charts
from blockviz.views.studies import table as study_table
from tests.helpers import NEUTRAL, claim, frame

ROWS = [
    ("a", 1, "converged", 2.0, {"ffn_mult": 2}),
    ("a", 2, "converged", 2.05, {"ffn_mult": 2}),
    ("b", 1, "blew up", 31.0, {"ffn_mult": 4}),
    ("b", 2, "stalled", 3.1, {"ffn_mult": 4}),
    ("b", 3, "", math.nan, {"ffn_mult": 4}),
]


def test_the_stability_column_says_how_each_failed_run_failed() -> None:
    table = study_table.results_table(summarize(frame(ROWS)), "a").set_index("Variant")
    assert table.loc["a", "Stability"] == "0 of 2 failed to train"
    assert (
        table.loc["b", "Stability"]
        == "2 of 2 failed to train (1 blew up, 1 stalled); 1 not finished"
    )


def test_the_verdicts_table_shows_both_intervals() -> None:
    # Every run ended (a verdict waits for a running one).
    rows = [*ROWS[:2], ("b", 1, "converged", 2.9, {"ffn_mult": 4}), ROWS[3]]
    verdict = judge(claim("lower_loss", better="a", worse="b"), frame(rows), NEUTRAL)
    table = study_table.verdicts_table([verdict])
    (intervals,) = table["Intervals"]
    assert intervals == verdict.comparisons[0].both()
    assert intervals.startswith("a minus b: paired ") and "n=2 pairs; unpaired " in intervals
    ratio = judge(claim("param_share", variant="a", part="ffn", low=0, high=1), frame([]), NEUTRAL)
    assert study_table.verdicts_table([ratio])["Intervals"].tolist() == [""]


def test_a_blown_up_run_is_drawn_at_the_top_and_left_out_of_the_mean() -> None:
    results = frame(ROWS)
    points = study_charts.swept_points(results, "ffn_mult").set_index("seed")
    on_scale = points.loc[points["outcome"].isin(["converged", "stalled"]), "loss"]
    blown = points[points["outcome"] == "blew up"]
    assert on_scale.max() == 3.1  # the blow-up does not stretch the axis
    assert blown["loss"].iloc[0] > 3.1 and blown["loss"].iloc[0] < 4
    assert blown["val_loss"].iloc[0] == 31.0  # its tooltip keeps the real loss
    spec = study_charts.swept_chart(results, "ffn_mult").to_dict()
    filters = [t.get("filter") for layer in spec["layer"] for t in layer.get("transform", [])]
    assert "datum.outcome != 'diverged' && datum.outcome != 'blew up'" in filters
    (shaped, *_) = [layer for layer in spec["layer"] if "shape" in layer["encoding"]]
    assert "blew up" in shaped["encoding"]["shape"]["scale"]["domain"]


def test_runs_scored_on_their_own_seeds_windows_are_called_out() -> None:
    results = frame(ROWS).assign(same_text=[True, True, False, True, False])
    # The unfinished run is not counted; one of the four finished runs is old-scheme.
    note = study_table.scoring_note(results)
    assert note is not None and note.startswith("1 of 4 finished runs were scored")
    assert study_table.scoring_note(results.assign(same_text=True)) is None
    assert study_table.scoring_note(results.iloc[0:0]) is None


def test_runs_scored_on_different_evaluation_sizes_are_called_out() -> None:
    """A custom sweep of batch_size scores 80 windows against 160: not quite one text."""
    results = frame(ROWS).assign(same_text=True, eval_windows=[160, 160, 80, 80, math.nan])
    note = study_table.scoring_note(results)
    assert note is not None and note.startswith("The finished runs were scored on 80 and 160")
    assert study_table.scoring_note(results.assign(eval_windows=160)) is None


def test_the_sensitivity_table_names_each_setting_of_several_swept_fields() -> None:
    """qk-norm-z-loss sweeps lr beside qk_norm and z_loss: one row per setting of both,
    never the z_loss variants pooled under one qk_norm value."""
    rows = []
    for qk, z, slope in ((False, 0.0, 1.0), (True, 0.0, 0.1), (False, 1e-4, 0.5)):
        for seed in (1, 2):
            for i, lr in enumerate((0.01, 0.1, 1.0)):
                loss = 2.0 + slope * i + seed / 100
                rows.append(("v", seed, "converged", loss, {"lr": lr, "qk_norm": qk, "z_loss": z}))
    table = study_table.sensitivity_display(frame(rows), ("lr", "qk_norm", "z_loss"))
    assert table is not None
    assert table["setting"].tolist() == [
        "qk_norm False, z_loss 0.0",
        "qk_norm True, z_loss 0.0",
        "qk_norm False, z_loss 0.0001",
    ]
    by_setting = table.set_index("setting")
    # (0 + slope + 2 slope) / 3 in each seed, so the same in the mean, with no spread.
    assert by_setting.loc["qk_norm True, z_loss 0.0", "LR sensitivity"].startswith("0.100")
    assert by_setting.loc["qk_norm False, z_loss 0.0", "best loss"].startswith("2.015")
    assert list(table.columns[-3:]) == ["best loss", "best loss, 95% interval", "seeds"]
