"""A study's per-variant table: counts of each outcome and the val loss's mean and 95%
interval over the seeds (torch-free; the verdicts are `blockviz.core.studies.verdicts`)."""

from __future__ import annotations

import math

import pandas as pd

from blockviz.core.studies.outcomes import OUTCOMES, usable_losses
from blockviz.core.studies.stats import mean_interval

# A summary column per outcome ("blew up" is "blew_up", a name itertuples keeps).
OUTCOME_COLUMNS = {outcome: outcome.replace(" ", "_") for outcome in OUTCOMES}
SUMMARY_COLUMNS = (
    "variant",
    "runs",
    "finished",
    *OUTCOME_COLUMNS.values(),
    "mean",
    "sd",
    "low",
    "high",
    "train_loss",
    "n_params",
    "time_s",
)


def summarize(results: pd.DataFrame) -> pd.DataFrame:
    """One row per variant (in the order its runs appear) with counts and val-loss stats."""
    rows = []
    for variant in dict.fromkeys(results["variant"]) if not results.empty else ():
        runs = results[results["variant"] == variant]
        done = runs[runs["outcome"] != ""]
        interval = mean_interval(usable_losses(done)["val_loss"])
        rows.append(
            {
                "variant": variant,
                "runs": len(runs),
                "finished": len(done),
                **{
                    column: int((done["outcome"] == outcome).sum())
                    for outcome, column in OUTCOME_COLUMNS.items()
                },
                "mean": interval.mean if interval else math.nan,
                "sd": interval.sd if interval and interval.n > 1 else math.nan,
                "low": interval.low if interval and interval.n > 1 else math.nan,
                "high": interval.high if interval and interval.n > 1 else math.nan,
                # A diverged run's last finite train loss (thousands) says nothing typical.
                "train_loss": _mean(done.loc[done["outcome"] != "diverged", "train_loss"]),
                "n_params": _mean(runs["n_params"]),
                "time_s": _mean(done["time_s"]),
            }
        )
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def _mean(values: pd.Series) -> float:
    interval = mean_interval(values)
    return interval.mean if interval else math.nan
