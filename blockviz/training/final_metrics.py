"""The final metrics a run records when it ends (`final` in the store, what `show`,
Compare and the report read): from the fit that just ended, or, for a run killed after
its last step before it recorded them, from its stored train/* rows (`core.spec.final_text`
prints them as one line).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from blockviz.core.spec import (
    TRAIN_ELAPSED_S,
    TRAIN_LOSS,
    TRAIN_STEP_TIME,
    TRAIN_TOKENS_PER_SEC,
    VAL_ANSWER_ACC,
    VAL_ANSWER_BASELINE,
    VAL_BPC,
    VAL_LOSS,
    VAL_PPL,
)
from blockviz.training.callbacks import RECENT_LOSSES, training_monitor

if TYPE_CHECKING:
    from blockviz.store import RunStore
    from blockviz.training.fit import Outcome


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def final_metrics(
    lit: Any, trainer: Any, outcome: Outcome, run: int = 0
) -> dict[str, float | int | None]:
    """Run `run`'s recent train loss, its last evaluation (of `lit`, the module that trained
    it), training time and throughput, and the step the fit ended at; a value that is not
    finite as None."""
    monitor = training_monitor(trainer)
    last_val = lit.last_vals[run]
    return {
        "train_loss": _finite_or_none(monitor.recent_train_loss(run)),
        "val_loss": _finite_or_none(last_val.get(VAL_LOSS)),
        "val_ppl": _finite_or_none(last_val.get(VAL_PPL)),
        "val_bpc": _finite_or_none(last_val.get(VAL_BPC)),
        "answer_acc": _finite_or_none(last_val.get(VAL_ANSWER_ACC)),
        "answer_baseline": _finite_or_none(last_val.get(VAL_ANSWER_BASELINE)),
        "time_s": round(monitor.wall_time_s(), 3),  # training wall time, evaluations included
        "tokens_per_sec": monitor.tokens_per_sec(),  # while training, evaluations excluded
        "steps": outcome.step,
    }


def recorded_training(store: RunStore, run_id: int) -> dict[str, float | None]:
    """train_loss, time_s and tokens_per_sec as `final_metrics` has them, from the run's
    train/* rows: for a run that died after its last step, before it recorded them.

    Each row is the mean of the steps since the row before it, so rows are weighted by the
    steps they cover; time_s is the last session's wall clock at its last step.
    """
    names = [TRAIN_LOSS, TRAIN_STEP_TIME, TRAIN_TOKENS_PER_SEC, TRAIN_ELAPSED_S]
    frame = store.scalars(run_id, names=names)
    series = {
        name: dict(zip(rows["step"], rows["value"], strict=True))
        for name, rows in frame.groupby("name")
    }
    loss = series.get(TRAIN_LOSS, {})
    if not loss:
        return {}
    steps = sorted(loss)
    covered = {step: step - before for before, step in zip([-1, *steps[:-1]], steps, strict=True)}
    start = steps[-1] - RECENT_LOSSES  # the window: the last RECENT_LOSSES steps
    weights = {step: min(covered[step], step - start) for step in steps if step > start}
    step_time, rate = series.get(TRAIN_STEP_TIME, {}), series.get(TRAIN_TOKENS_PER_SEC, {})
    timed = [step for step in step_time if step in rate and step in covered]
    seconds = sum(step_time[step] * covered[step] for step in timed)
    tokens = sum(rate[step] * step_time[step] * covered[step] for step in timed)
    elapsed = series.get(TRAIN_ELAPSED_S, {})
    return {
        "train_loss": _finite_or_none(
            sum(loss[step] * w for step, w in weights.items()) / sum(weights.values())
        ),
        "time_s": elapsed[max(elapsed)] if elapsed else None,
        "tokens_per_sec": _finite_or_none(tokens / seconds) if seconds > 0 else None,
    }
