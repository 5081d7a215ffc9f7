"""What a stored run says about itself: its model config, where and how it diverged (read
from the store; the facts and their sentences are `core.divergence`), its recent speed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.config import RunConfig
from blockviz.core.config_model import ModelConfig
from blockviz.core.divergence import (
    Divergence,
    summarize_divergence,
)
from blockviz.core.fields import ConfigError

if TYPE_CHECKING:
    from blockviz.store import RunRecord, RunStore

DIVERGENCE_WINDOW = 200  # steps before the divergence read whole for its summary


def stored_model_config(run: RunRecord) -> ModelConfig | None:
    """The run's model config as stored with it; None when missing or damaged.

    Every run's config was validated before it was launched, so one that no longer
    validates was damaged since; callers fall back to what every run has (one layer).
    """
    stored = run.config
    if not isinstance(stored, dict) or not isinstance(stored.get("model"), dict):
        return None
    try:
        return RunConfig.from_dict(stored).model.validate()
    except (ConfigError, TypeError, ValueError):
        return None


def read_divergence(store: RunStore, run: RunRecord) -> Divergence:
    """Summarize a diverged run from the store, reading its last steps whole.

    A chart's series may be downsampled; these steps are not, so the last finite loss
    and the first non-finite values are exact.
    """
    end = run.diverged_step or run.step or 0
    recent = store.scalars(int(run.id), after_step=max(int(end) - DIVERGENCE_WINDOW, -1))
    return summarize_divergence(recent, diverged_step=run.diverged_step, error=run.error)


def recent_tokens_per_sec(scalars: pd.DataFrame, window: int = 50) -> float | None:
    """Median tokens/s of the last `window` logged steps (None before the first).

    The median, because the steps that also evaluate or probe are many times slower and
    would make a mean jump.
    """
    rows = scalars[scalars["name"] == spec.TRAIN_TOKENS_PER_SEC].sort_values("step")
    values = rows["value"].to_numpy(dtype=float)
    finite = values[np.isfinite(values)][-window:]
    return float(np.median(finite)) if finite.size else None
