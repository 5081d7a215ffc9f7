"""How each run of a study ended, and the study's runs as one results frame (torch-free).

A finished run is one of four outcomes:

- **diverged**: its loss became non-finite (the run's status says so, at which step);
- **blew up**: it completed with a finite final val loss more than `BLOWUP_MARGIN` nats
  above the loss of a uniform guess (`init_loss` = ln of the vocabulary size, recorded
  with the run's dataset fingerprint): training made it confidently wrong;
- **stalled**: it completed, but its final val loss is within `STALL_MARGIN` nats of the
  unigram entropy of the training text (`unigram_nats`, recorded beside `init_loss`) or
  above it (up to the blow-up line): it did no better than predicting each character by
  its frequency alone;
- **converged**: it completed below that line.

Diverged, blew up and stalled runs *failed to train* (`FAILED`).

Queued, running, stopped and failed runs have no outcome yet (""). `lr_sensitivity` is the
learning-rate sensitivity of Wortsman et al. 2023 over a sweep of one variant's runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from blockviz.core import evaluation
from blockviz.core.studies.define import StudyDef, swept_value

# A model that learnt anything beyond character frequencies beats the unigram entropy by
# far more than this (the quick studies' converged runs end 0.5 to 1.5 nats below it on
# pydocs); a tenth of a nat is within the noise of a val estimate from a few batches.
STALL_MARGIN = 0.1
# A model at initialisation scores within a few tenths of a nat of ln(vocab) (its logits
# start near zero), and one that stopped learning sits between the unigram entropy and
# there. Ending a whole nat above the uniform guess (e times its perplexity) takes
# confident wrong predictions, which a stall does not make and a blow-up does.
BLOWUP_MARGIN = 1.0
OUTCOMES = ("converged", "diverged", "blew up", "stalled")
FAILED = ("diverged", "blew up", "stalled")
FINISHED_STATUSES = ("completed", "diverged")
RESULT_COLUMNS = {
    "run_id": "int64",
    "variant": "str",
    "seed": "int64",
    "status": "str",
    "outcome": "str",
    "diverged_step": "float64",
    "val_loss": "float64",
    "train_loss": "float64",
    "n_params": "float64",
    "time_s": "float64",
    "unigram_nats": "float64",
    "init_loss": "float64",
    "same_text": "bool",  # scored on the shared evaluation set (core.evaluation)
    "eval_windows": "float64",  # how many of its windows (eval_iters × batch_size)
}


def _number(value: Any) -> float:
    """A float, NaN for None / missing / non-numbers (infinities kept)."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def classify(
    status: str, val_loss: float | None, unigram: float | None, init_loss: float | None = None
) -> str:
    """A run's outcome from its status, final val loss, the corpus's unigram entropy and
    the loss of a uniform guess."""
    if status == "diverged":
        return "diverged"
    if status != "completed":
        return ""
    loss = _number(val_loss)
    if not math.isfinite(loss):
        # A run records its final val loss only when it is finite (every study size
        # evaluates several times per run), so a completed run without one blew up there.
        return "diverged"
    uniform = _number(init_loss)
    if math.isfinite(uniform) and loss > uniform + BLOWUP_MARGIN:
        return "blew up"
    reference = _number(unigram)
    if math.isfinite(reference) and loss >= reference - STALL_MARGIN:
        return "stalled"
    return "converged"


def results_frame(runs: pd.DataFrame, study: StudyDef) -> pd.DataFrame:
    """One row per run of the study (`store.study_runs`), with its outcome and the
    variant's value of every swept column."""
    rows = []
    for run in runs.itertuples(index=False):
        final = run.final if isinstance(run.final, Mapping) else {}
        dataset = run.dataset if isinstance(run.dataset, Mapping) else {}
        val_loss = _number(final.get("val_loss"))
        unigram = _number(dataset.get("unigram_nats"))
        init_loss = _number(dataset.get("init_loss"))
        rows.append(
            {
                "run_id": int(run.id),
                "variant": str(run.variant),
                "seed": int(run.seed),
                "status": str(run.status),
                "outcome": classify(str(run.status), val_loss, unigram, init_loss),
                "diverged_step": _number(run.diverged_step),
                "val_loss": val_loss,
                "train_loss": _number(final.get("train_loss")),
                "n_params": _number(run.n_params),
                "time_s": _number(final.get("time_s")),
                "unigram_nats": unigram,
                "init_loss": init_loss,
                "same_text": evaluation.same_text(dataset),
                "eval_windows": _number((dataset.get(evaluation.KEY) or {}).get("windows")),
            }
        )
    frame = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    frame = frame.astype({k: ("object" if v == "str" else v) for k, v in RESULT_COLUMNS.items()})
    labels = {v.label for v in study.variants}
    for name in study.swept:
        values = {label: swept_value(study, label, name) for label in labels}
        frame[name] = [values.get(label) for label in frame["variant"]]
    return frame


def lr_sensitivity(lrs: Sequence[float], losses: Sequence[float], init_loss: float) -> float:
    """Learning-rate sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale
    Transformer training instabilities", arXiv:2309.14322, section 3.2).

    Over the learning rates swept, the mean of  min(loss(lr), init_loss) − best,  where
    best is the lowest loss over the sweep and a run whose loss is not finite (it
    diverged) counts as `init_loss`, the loss at initialisation. 0 means every learning
    rate reached the best loss; larger means the loss depends more on the learning rate.
    NaN when no run of the sweep reached a finite loss or the inputs are empty.
    """
    if len(lrs) != len(losses):
        raise ValueError(f"{len(lrs)} learning rates but {len(losses)} losses")
    capped = []
    for loss in losses:
        value = _number(loss)
        capped.append(min(value, init_loss) if math.isfinite(value) else init_loss)
    finite = [_number(x) for x in losses if math.isfinite(_number(x))]
    if not capped or not finite:
        return math.nan
    best = min(min(finite), init_loss)
    return float(np.mean([c - best for c in capped]))


def outcome_counts(counts: Mapping[str, int]) -> str:
    """`1 converged, 1 stalled`: the non-zero counts in OUTCOMES order ("none" if none)."""
    parts = [f"{int(counts.get(o, 0))} {o}" for o in OUTCOMES if int(counts.get(o, 0)) > 0]
    return ", ".join(parts) or "none"


def usable_losses(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with their val loss as a level to compare: a blown-up run's finite but
    far-above-uniform loss is no such level (NaN here, like a diverged run's)."""
    if runs.empty or "outcome" not in runs.columns or "val_loss" not in runs.columns:
        return runs
    blew_up = runs["outcome"] == "blew up"
    if not blew_up.any():
        return runs
    return runs.assign(val_loss=runs["val_loss"].where(~blew_up))
