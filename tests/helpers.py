"""Shared test fixtures that are plain functions (importable, unlike conftest's)."""

from __future__ import annotations

from typing import Any

from blockviz.core import config as cfg

TINY_RUN = {
    "n_layer": 2,
    "n_head": 2,
    "d_model": 16,
    "block_size": 16,
    "batch_size": 4,
    "max_steps": 6,
    "warmup_steps": 2,
    "eval_interval": 3,
    "eval_iters": 2,
    "probe_interval": 2,
    "sample_interval": 3,
    "accelerator": "cpu",
}


def tiny_config(**overrides: Any) -> cfg.RunConfig:
    """A validated 2-layer, d_model 16 run config that trains in well under a second."""
    return cfg.replace(cfg.RunConfig(), **{**TINY_RUN, **overrides}).validate()
