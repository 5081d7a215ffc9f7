"""The config fields as sidebar widgets: their groups, the datasets, widget values.

What each widget is comes from the field registry (`core.config.FIELDS`); Streamlit-free:
how they are drawn is `sidebar`.
"""

from __future__ import annotations

from typing import Any

from blockviz.core import config, fields, spec
from blockviz.core.config import BOUNDS
from blockviz.core.corpora import BUILTIN
from blockviz.core.fields import ConfigField

UPLOAD_CHOICE = "upload your own text"
DATASET_CHOICES = (*BUILTIN, UPLOAD_CHOICE)  # a new built-in corpus needs only a note below
DATASET_NOTES = {
    "pydocs": "Python's built-in help topics (~1 MB of English prose and code), offline.",
    "pycode": "Python standard-library source (first 2M characters), offline.",
    "shakespeare": "Tiny Shakespeare: downloads 1.1 MB once, then read from the cache.",
    "ops": f"Synthetic lines like `max(3,9,2)=9`: {spec.VAL_ANSWER_ACC} measures the answers.",
    UPLOAD_CHOICE: "Your own UTF-8 text (.txt, .md, .py, .csv), at most 20 MB.",
}
FINAL_NORM_CHOICES = ("auto", "on", "off")
# A field's widget is its ConfigField in the registry (`config.FIELDS`): label, help, kind,
# choices, step, format, bounds; here the sidebar's groups of them.


def _group(name: str) -> tuple[ConfigField, ...]:
    return tuple(spec for spec in config.FIELDS.values() if spec.group == name)


ARCHITECTURE = _group(fields.ARCHITECTURE)
TRAINING = _group(fields.TRAINING)
TRAINING_ADVANCED = _group(fields.ADVANCED)
OPS_FIELDS = _group(fields.OPS)
(VAL_FRACTION,) = _group(fields.DATA)
ALL_FIELDS = (*ARCHITECTURE, *TRAINING, *TRAINING_ADVANCED, *OPS_FIELDS, VAL_FRACTION)
SPECS = {spec.name: spec for spec in ALL_FIELDS}
# The Playground's fields, beside its chart (the sidebar leaves them out there): the block's
# wiring, its depth and the learning rate. Each flips a curve within a few hundred steps.
QUICK_FIELDS = (
    "norm_position",
    "norm_type",
    "residual",
    "attention",
    "ffn",
    "activation",
    "n_layer",
    "lr",
)
# Fields a run fills in itself: vocab_size comes from the dataset, dataset from its widget.
NOT_WIDGETS = ("vocab_size", "dataset")


def to_widget(name: str, value: Any) -> Any:
    """A config value as its widget holds it."""
    if name == "final_norm":
        return {None: "auto", True: "on", False: "off"}[value]
    if name == "dataset":
        return value if value in DATASET_CHOICES else UPLOAD_CHOICE
    spec = SPECS.get(name)
    if spec is not None and spec.kind == "float":
        return float(value)
    if spec is not None and spec.kind == "int":
        return int(value)
    return value


def from_widget(name: str, value: Any) -> Any:
    """A widget value as the config field holds it."""
    if name == "final_norm":
        return {"auto": None, "on": True, "off": False}.get(value)
    return value


def widget_range(name: str, kind: str) -> tuple[int, int] | tuple[float, float]:
    """(min_value, max_value) of a number widget: the field's bound (config.BOUNDS), typed."""
    bound = BOUNDS[name]
    if kind == "int":
        return int(bound.low), int(bound.high)
    return float(bound.low), float(bound.high)
