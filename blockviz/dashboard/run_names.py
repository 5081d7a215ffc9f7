"""Run names: suggested from what differs from the preset, and checked before launch."""

from __future__ import annotations

from pathlib import Path

from blockviz.core import config
from blockviz.core.config import RunConfig
from blockviz.dashboard.config_fields import DATASET_CHOICES, SPECS
from blockviz.store import StoreError, check_name, sanitize_name

_NAME_TOKENS = {
    "norm_position": lambda v: {"pre": "pre-ln", "post": "post-ln", "none": "no-norm"}[v],
    "norm_type": lambda v: v,
    "residual": lambda v: "resid" if v else "no-resid",
    "residual_scale": lambda v: f"rs{v:g}",
    "attention": lambda v: "attn" if v else "no-attn",
    "ffn": lambda v: "ffn" if v else "no-ffn",
    "activation": lambda v: v,
    "ffn_mult": lambda v: f"ffn{v}x",
    "n_layer": lambda v: f"{v}L",
    "n_head": lambda v: f"{v}H",
    "d_model": lambda v: f"d{v}",
    "block_size": lambda v: f"ctx{v}",
    "bias": lambda v: "bias" if v else "nobias",
    "final_norm": lambda v: {None: "finalnorm-auto", True: "finalnorm", False: "no-finalnorm"}[v],
    "tie_weights": lambda v: "tied" if v else "untied",
    "init": lambda v: f"{v}-init",
    "max_steps": lambda v: f"{v}steps",
    "lr": lambda v: f"lr{v:g}",
    "dataset": lambda v: Path(v).stem if v not in DATASET_CHOICES else v,
}
MAX_NAME_TOKENS = 5


def suggest_name(preset_name: str, run_config: RunConfig) -> str:
    """A run name from what differs from the preset, e.g. 'post-ln-relu-6L'."""
    changed = config.diff(config.preset(preset_name), run_config)
    changed.pop("vocab_size", None)  # follows the dataset, which names itself
    # Sidebar order: the architecture choices a name is mostly about come first.
    order = {name: index for index, name in enumerate(SPECS)}
    tokens = []
    for name, (_, new) in sorted(changed.items(), key=lambda item: order.get(item[0], len(order))):
        token = _NAME_TOKENS.get(name, lambda v, n=name: f"{n}{v}")(new)
        tokens.append(str(token))
    if not tokens:
        return preset_name
    shown = tokens[:MAX_NAME_TOKENS]
    if len(tokens) > MAX_NAME_TOKENS:
        shown.append(f"+{len(tokens) - MAX_NAME_TOKENS}")
    name = sanitize_name("-".join(shown))
    try:
        return check_name(name)
    except StoreError:  # an upload named 2024.txt: a bare number would read as a run id
        return f"run-{name}"


def checked_name(typed: str) -> tuple[str, str | None]:
    """The sanitised run name and, when it cannot be used (a bare number), why not."""
    try:
        return check_name(typed), None
    except StoreError as exc:
        return sanitize_name(typed), str(exc)
