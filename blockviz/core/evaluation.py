"""The evaluation set: which validation windows every run is scored on (torch-free).

Every run of a dataset and block size is scored on the same text. Its validation windows
are drawn from one fixed evaluation seed, never from the training seed: the seed changes
how a model trains, not the ruler it is measured with. (Until this scheme, each run drew
its windows from its own training seed, so two seeds of one variant were scored on
different text: one checkpoint read 0.19 nats apart on two seeds' windows while models of
different seeds differed by about 0.01 on the same windows.)

A run scores `eval_iters × batch_size` windows of `block_size + 1` characters. They are
drawn `EVAL_DRAW` at a time, so the windows of a smaller count are the first windows of
a larger one: runs with different batch sizes but the same product score the same text,
and a larger evaluation scores a superset of a smaller one.

Why windows and not the whole validation split: the split is 46,504 characters of pydocs
(726 windows of 64) and 195,912 of pycode (3,061), against the 160 windows a quick study
run scores at each evaluation; scoring the whole split would multiply the cost of every
evaluation by 4.5 to 19. A fixed sample already removes the difference between seeds,
and `eval_iters` buys precision when it is wanted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EVAL_SEED = 271_828  # any fixed number would do; it never changes, or old runs stop comparing
EVAL_DRAW = 64  # windows per draw from the evaluation generator
SCHEME = "eval-seed"
KEY = "evaluation"  # where a run's dataset fingerprint records how it is scored
# Runs recorded before this scheme drew their windows from the training seed plus this
# offset; resumed, they keep doing so (`legacy_record`), so one run is one measurement.
LEGACY_SCHEME = "training-seed"
LEGACY_OFFSET = 1_000_003


def record(windows: int, block_size: int) -> dict[str, Any]:
    """What a run records, in its dataset fingerprint, about the windows it is scored on."""
    return {
        "scheme": SCHEME,
        "seed": EVAL_SEED,
        "windows": int(windows),
        "block_size": int(block_size),
    }


def legacy_record(windows: int, block_size: int, seed: int) -> dict[str, Any]:
    """The record of a resumed old run that still draws its windows from its training seed."""
    return {
        "scheme": LEGACY_SCHEME,
        "seed": int(seed) + LEGACY_OFFSET,
        "windows": int(windows),
        "block_size": int(block_size),
    }


def scored_on(dataset: Mapping[str, Any] | None) -> str:
    """How a run's val loss was measured, in words, from its dataset fingerprint."""
    if not isinstance(dataset, Mapping) or not dataset:
        return "unknown (the run has no dataset record yet)"
    evaluation = dataset.get(KEY)
    if not isinstance(evaluation, Mapping) or evaluation.get("scheme") != SCHEME:
        return (
            "validation windows drawn from its training seed (runs before the evaluation "
            "seed): another seed's run was scored on other text"
        )
    return (
        f"{evaluation.get('windows')} validation windows of {evaluation.get('block_size')} "
        f"characters from the evaluation seed {evaluation.get('seed')}: the same text as "
        "every other run of this dataset, block size and evaluation size"
    )


def same_text(dataset: Mapping[str, Any] | None) -> bool:
    """True when the run was scored on the shared evaluation set (not its seed's windows)."""
    if not isinstance(dataset, Mapping):
        return False
    evaluation = dataset.get(KEY)
    return isinstance(evaluation, Mapping) and evaluation.get("scheme") == SCHEME
