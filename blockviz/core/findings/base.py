"""What a finding is, what the rules read of a run, and the helpers the rules share.

`RunSeries` holds a run's stored frames and reads each series or per-layer table once, then
keeps it (the rules read several of them more than once). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from blockviz.core import spec
from blockviz.core.config import RunConfig
from blockviz.core.divergence import format_nonfinite
from blockviz.core.findings.thresholds import PERSIST

# ---------------------------------------------------------------------------- results

# The events a replay replays (training.replay, core.flight), as findings name them.
SPIKE, DIVERGENCE = EVENTS = ("loss spike", "divergence")
NO_DATA = "no data recorded"  # why a check could not be made: the run has none of its data
# A check that does not apply to the model: gradients across depth in a one-block model.
ONE_BLOCK = "the model has one block, so no depth to compare"


@dataclass(frozen=True)
class Suggestion:
    """Something to try: config fields and values, why, and where the idea comes from (a
    paper or a rule of thumb, then what runs of this code showed of it: `remedy` names it
    in `core.findings.suggestions.EVIDENCE`)."""

    text: str
    changes: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    remedy: str = ""


@dataclass(frozen=True)
class Finding:
    """One statement about a run: which rule, how serious, the words and the evidence.

    `series` names what draws it (a scalar such as "train/loss", or a layer statistic such
    as "grad_norm", "dead_frac", "attn_logit_max"); `step` is where a chart marks it.
    """

    rule: str
    severity: str
    title: str
    text: str
    step: int | None
    series: str
    evidence: dict[str, Any] = field(default_factory=dict)
    suggestion: Suggestion | None = None

    @property
    def tab(self) -> str:
        """The Live tab that draws `series`."""
        return series_tab(self.series)


def series_tab(series: str) -> str:
    """The Live tab of a scalar or layer statistic."""
    if "/" in series:
        return "Loss"
    if series in spec.NORM_STATS:
        return "Gradients"
    if series == spec.UPDATE_RATIO:
        return "Updates"
    if series in spec.HEAD_STATS:
        return "Attention"
    return "Activations"


@dataclass(frozen=True)
class RunSeries:
    """What the rules read of one run: its row's facts and its stored series.

    `scalars` has columns step, name, value; `layers` has step, layer, kind, component,
    stat, value (the rows a rule needs: component grad_norm / update_ratio, tap and head
    statistics). Either may hold more; rules select.
    """

    status: str
    diverged_step: int | None
    config: RunConfig | None
    unigram: float | None
    init_loss: float | None
    scalars: pd.DataFrame
    layers: pd.DataFrame
    error: str | None = None  # what the run recorded when it stopped
    # What replays of the run found (training.replay): each one's event, event_step and
    # sentence, oldest first; a spike or divergence finding cites the newest of its kind.
    replays: tuple[dict[str, Any], ...] = ()
    # Each series and table read so far (several rules read the same ones).
    _read: dict[Any, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_layer(self) -> int:
        """The model's blocks: from its config, else from the layers its probes recorded
        (the head end's component rows sit at layer n_layer), else 1."""
        if self.config is not None:
            return self.config.model.n_layer
        rows = self.layers
        components = rows[rows["kind"] == "component"]["layer"]
        if len(components):
            return max(1, int(components.max()))
        taps = rows[rows["kind"] == "tap"]["layer"]
        return int(taps.max()) + 1 if len(taps) else 1

    def scalar(self, name: str) -> pd.DataFrame:
        """One scalar series: step, value, one row per step in step order."""
        key = ("scalar", name)
        if key not in self._read:
            if "groups" not in self._read:
                self._read["groups"] = dict(tuple(self.scalars.groupby("name", sort=False)))
            rows = self._read["groups"].get(name, self.scalars.iloc[0:0])
            rows = rows[["step", "value"]].drop_duplicates("step", keep="last")
            self._read[key] = rows.sort_values("step", kind="stable").reset_index(drop=True)
        return self._read[key]

    def table(self, kind: str, stat: str, component: str | None = None) -> pd.DataFrame:
        """A step x layer table of one per-layer statistic (step x (layer, head) for kind
        head); rows are steps in order. Empty when nothing was recorded."""
        key = ("table", kind, stat, component)
        if key not in self._read:
            if "layer groups" not in self._read:
                grouped = self.layers.groupby(["kind", "stat"], sort=False)
                self._read["layer groups"] = dict(tuple(grouped))
            rows = self._read["layer groups"].get((kind, stat))
            if rows is not None and component is not None:
                rows = rows[rows["component"] == component]
            if rows is None or rows.empty:
                self._read[key] = pd.DataFrame()
            else:
                self._read[key] = _grid(rows, head=kind == "head")
        return self._read[key]


def _grid(rows: pd.DataFrame, head: bool) -> pd.DataFrame:
    """rows (step, layer[, component], value) as a step x column table, filled with numpy.

    The store keeps one row per cell (its primary key); a NaN stays NaN: the gradient of a
    diverged step is a value to report, not a gap.
    """
    steps, row_of = np.unique(rows["step"].to_numpy(), return_inverse=True)
    layers = rows["layer"].to_numpy()
    if head:
        keys = pd.MultiIndex.from_arrays([layers, rows["component"].to_numpy()])
        codes, columns = pd.factorize(keys, sort=True)
        columns = pd.MultiIndex.from_tuples(list(columns))
    else:
        columns, codes = np.unique(layers, return_inverse=True)
    grid = np.full((len(steps), len(columns)), np.nan)
    grid[row_of, codes] = rows["value"].to_numpy(dtype=float)
    return pd.DataFrame(grid, index=pd.Index(steps, name="step"), columns=columns)


class StoredRun(Protocol):
    """What `run_series` reads of a stored run (a `store.RunRecord` has these fields)."""

    @property
    def status(self) -> str | None: ...
    @property
    def config(self) -> dict[str, Any] | None: ...
    @property
    def dataset(self) -> dict[str, Any] | None: ...
    @property
    def diverged_step(self) -> int | None: ...
    @property
    def error(self) -> str | None: ...


def run_series(
    run: StoredRun,
    scalars: pd.DataFrame,
    layers: pd.DataFrame,
    replays: tuple[dict[str, Any], ...] = (),
) -> RunSeries:
    """A RunSeries from a run's stored row (as `RunStore.get_run` gives it), frames, and
    what its replays found."""
    try:
        config = RunConfig.from_dict(run.config) if run.config else None
    except (ValueError, TypeError, KeyError):
        config = None
    dataset = run.dataset if isinstance(run.dataset, Mapping) else {}
    unigram, init_loss = dataset.get("unigram_nats"), dataset.get("init_loss")
    diverged = run.diverged_step
    return RunSeries(
        status=str(run.status or ""),
        diverged_step=None if diverged is None else int(diverged),
        config=config,
        unigram=float(unigram) if isinstance(unigram, int | float) else None,
        init_loss=float(init_loss) if isinstance(init_loss, int | float) else None,
        scalars=scalars,
        layers=layers,
        error=str(run.error) if run.error else None,
        replays=tuple(replays),
    )


# ---------------------------------------------------------------------------- helpers


def replay_found(series: RunSeries, event: str, steps: Iterable[int]) -> str:
    """What the newest replay of this run's `event` at one of `steps` found, as a sentence
    ("" for none)."""
    at = {int(step) for step in steps}
    found = [
        r
        for r in series.replays
        if r.get("event") == event and r.get("event_step") in at and r.get("sentence")
    ]
    return str(found[-1]["sentence"]) if found else ""


def num(value: float) -> str:
    """A number as findings write it: three significant digits."""
    if not math.isfinite(value):
        return format_nonfinite(value)
    return f"{value:.3g}"


def step_text(value: int) -> str:
    return f"step {value:,}"


def layer_name(layer: int, n_layer: int) -> str:
    return spec.layer_label(layer, n_layer)


def layer_names(layers: list[int], n_layer: int) -> str:
    """'block 2', 'blocks 0–3', 'blocks 0–2 and 5', 'embeddings and blocks 1 and 3'."""
    blocks = sorted(layer for layer in layers if 0 <= layer < n_layer)
    parts = [layer_name(layer, n_layer) for layer in sorted(set(layers) - set(blocks))]
    runs: list[list[int]] = []
    for layer in blocks:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    spans = [f"{r[0]}–{r[-1]}" if len(r) > 2 else " and ".join(map(str, r)) for r in runs]
    if spans:
        word = "block" if len(blocks) == 1 else "blocks"
        parts.insert(0, f"{word} {spec.and_list(spans)}")
    return spec.and_list(parts)


def streak(condition: pd.Series) -> int | None:
    """The first index of the unbroken run of True that ends at the last entry, if that run
    holds at least PERSIST entries; else None."""
    values = condition.to_numpy(dtype=bool)
    if len(values) < PERSIST or not values[-PERSIST:].all():
        return None
    falses = np.flatnonzero(~values)
    start = falses[-1] + 1 if falses.size else 0
    return int(condition.index[start])


def streaking(condition: pd.DataFrame) -> tuple[list[Any], int] | None:
    """The columns whose condition holds at the last PERSIST steps, and the step since which
    it has held for every one of them (the latest start of their streaks); None if none."""
    starts = {column: streak(condition[column]) for column in condition.columns}
    held = {column: start for column, start in starts.items() if start is not None}
    if not held:
        return None
    return list(held), max(held.values())


def lr_at(series: RunSeries, steps: pd.Index) -> pd.Series:
    """The logged learning rate at each step (the nearest logged step at or before it)."""
    lr = series.scalar(spec.TRAIN_LR)
    if lr.empty:
        return pd.Series(np.nan, index=steps)
    positions = np.searchsorted(lr["step"].to_numpy(), steps.to_numpy(), side="right") - 1
    values = lr["value"].to_numpy(dtype=float)
    picked = np.where(positions >= 0, values[np.clip(positions, 0, None)], np.nan)
    return pd.Series(picked, index=steps)


def blocks(table: pd.DataFrame, n_layer: int) -> pd.DataFrame:
    """The columns of a step x layer table that are blocks (not embeddings or head)."""
    if table.empty:
        return table
    keep = [c for c in table.columns if 0 <= (c[0] if isinstance(c, tuple) else c) < n_layer]
    return table[keep]


def finite_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The steps at which every value of the table is finite."""
    if table.empty:
        return table
    return table[np.isfinite(table.to_numpy(dtype=float)).all(axis=1)]


def per_layer(
    rule: str,
    title: str,
    text: str,
    series_name: str,
    layers: list[int],
    since: int,
    newest: int,
    values: pd.DataFrame | None = None,
    suggestion: Suggestion | None = None,
    severity: str = "warning",
) -> Finding:
    """A state finding about some blocks: the evidence names them, the step since which it
    has held for all of them, the newest probe step and each one's newest value."""
    evidence: dict[str, object] = {"layers": layers, "since": since, "step": newest}
    if values is not None:
        evidence["values"] = {c: float(values[c].iloc[-1]) for c in layers}
    return Finding(rule, severity, title, text, since, series_name, evidence, suggestion)
