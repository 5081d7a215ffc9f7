"""The x axis of time-series charts: training step, wall-clock time or tokens seen.

A chart draws the column an `XAxis` names; `with_x` adds that column to a tidy frame
(one row per run and step) from what each run recorded:

- tokens seen at step s = s x tokens per step: the tokens the model had trained on when
  the value was measured. Tokens per step = batch_size x block_size x devices x num_nodes,
  from the run's stored config (each device draws its own batch; there is no gradient
  accumulation).
- wall-clock time at step s = the run's `train/elapsed_s` scalar: seconds from the start
  of training to the end of that logged step, validation included. Steps between two
  logged ones (probe and validation steps) are placed by linear interpolation; rows
  outside the logged range are left out. A resumed run's clock restarts at 0, so each
  restart is added to the time already recorded (the pause between is not counted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.views.charts.base import STEP_AXIS, XAxis

if TYPE_CHECKING:
    from blockviz.store import RunRecord

TIME_AXIS = XAxis("time_s", "wall-clock time since training started (s)", ",.3~r", integer=False)
TOKENS_AXIS = XAxis("tokens", "tokens seen", ".3~s", integer=False)
X_AXES = {"step": STEP_AXIS, "time": TIME_AXIS, "tokens": TOKENS_AXIS}
X_AXIS_LABELS = {"step": "Step", "time": "Wall-clock time", "tokens": "Tokens seen"}
NO_TIME_NOTE = "wall-clock time was not recorded for this run"


def tokens_per_step(config: Mapping[str, object] | None) -> int | None:
    """Tokens one optimizer step trains on, from a stored run config (None if unreadable)."""
    if not isinstance(config, Mapping):
        return None
    train, model = config.get("train"), config.get("model")
    if not isinstance(train, Mapping) or not isinstance(model, Mapping):
        return None
    try:
        factors = [
            int(train["batch_size"]),  # type: ignore[call-overload]
            int(model["block_size"]),  # type: ignore[call-overload]
            int(train.get("devices", 1) or 1),  # type: ignore[call-overload]
            int(train.get("num_nodes", 1) or 1),  # type: ignore[call-overload]
        ]
    except (KeyError, TypeError, ValueError):
        return None
    product = int(np.prod(factors))
    return product if product > 0 else None


def elapsed_clock(scalars: pd.DataFrame) -> pd.DataFrame:
    """One run's (step, time_s) from its train/elapsed_s records, continued across resumes."""
    rows = scalars[scalars["name"] == spec.TRAIN_ELAPSED_S].sort_values("step")
    values = pd.to_numeric(rows["value"], errors="coerce").to_numpy(dtype=float)
    keep = np.isfinite(values)
    steps, values = rows["step"].to_numpy()[keep], values[keep]
    if len(values) == 0:
        return pd.DataFrame({"step": pd.Series(dtype=int), "time_s": pd.Series(dtype=float)})
    # Where the clock went back (a resume), carry the time recorded before it.
    restarts = np.r_[False, np.diff(values) < 0]
    offset = np.cumsum(np.where(restarts, np.r_[0.0, values[:-1]], 0.0))
    clock = pd.DataFrame({"step": steps, "time_s": values + offset})
    return clock.drop_duplicates("step", keep="last").reset_index(drop=True)


@dataclass(frozen=True)
class RunClocks:
    """What each run recorded to place its steps in time and tokens."""

    tokens_per_step: dict[int, int]  # run id -> tokens per step (runs with a config)
    elapsed: dict[int, pd.DataFrame]  # run id -> (step, time_s) (runs that logged it)

    def missing(self, axis: str, run_ids: Sequence[int]) -> list[int]:
        """The runs that cannot be drawn on `axis`."""
        have = {"time": self.elapsed, "tokens": self.tokens_per_step}.get(axis)
        return [] if have is None else [int(i) for i in run_ids if int(i) not in have]


def run_clocks(runs: Sequence[RunRecord], scalars: pd.DataFrame) -> RunClocks:
    """Clocks of runs (their stored configs) from scalars holding train/elapsed_s."""
    per_step = {}
    for run in runs:
        tokens = tokens_per_step(run.config)
        if tokens is not None:
            per_step[int(run.id)] = tokens
    elapsed = {}
    timed = scalars[scalars["name"] == spec.TRAIN_ELAPSED_S] if len(scalars) else scalars
    for run_id, rows in timed.groupby("run_id"):
        clock = elapsed_clock(rows)
        if len(clock):
            elapsed[int(run_id)] = clock
    return RunClocks(per_step, elapsed)


def with_x(frame: pd.DataFrame, axis: str, clocks: RunClocks) -> pd.DataFrame:
    """`frame` with the column X_AXES[axis] draws; rows that cannot be placed are dropped."""
    if axis == "step" or frame.empty:
        column = X_AXES[axis].field
        return frame if column in frame.columns else frame.assign(**{column: frame["step"]})
    parts = []
    for run_id, rows in frame.groupby("run_id", sort=False):
        steps = rows["step"].to_numpy(dtype=float)
        if axis == "tokens":
            per_step = clocks.tokens_per_step.get(int(run_id))
            if per_step is None:
                continue
            parts.append(rows.assign(tokens=steps * per_step))
        else:
            clock = clocks.elapsed.get(int(run_id))
            if clock is None:
                continue
            known = clock["step"].to_numpy(dtype=float)
            seconds = np.interp(steps, known, clock["time_s"].to_numpy(dtype=float))
            inside = (steps >= known[0]) & (steps <= known[-1])
            parts.append(rows.assign(time_s=seconds)[inside])
    field = X_AXES[axis].field
    if not parts:
        return frame.iloc[0:0].assign(**{field: pd.Series(dtype=float)})
    return pd.concat(parts).sort_index()
