"""The Playground loop's bookkeeping (torch-free, Streamlit-free): what an auto-run trains,
when a sidebar change is settled enough to launch, what changed, the trail of runs and
its chart.

The Train page's Auto-run switch (`dashboard/playground.py`) keeps its state in the
session and asks these functions every decision, so each is a plain function of values
and timestamps that a test can call directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import altair as alt
import pandas as pd

from blockviz.core import config, spec
from blockviz.core.config import RunConfig
from blockviz.core.presets import PLAYGROUND_PRESET, PRESETS
from blockviz.views import charts

DEFAULT_STEPS = 800  # the toggles part the curves within them (docs/pages.md has the table)
MIN_STEPS, MAX_STEPS = 20, 5000  # short runs only: a long one belongs to Launch
DEFAULT_TRAIL = 5  # auto-runs kept on the chart
MAX_TRAIL = 10  # one colour each (the run palette has ten)
DEBOUNCE_S = 1.0  # a config must sit unchanged this long before it launches
EVALS_PER_RUN = 4  # evaluations (each followed by a checkpoint) in one auto-run
MAX_EVAL_ITERS = 10  # validation batches per evaluation in an auto-run
TRAIL_TITLE = "Auto-runs: loss"
NEWEST_WIDTH = 8  # the halo under the newest run's train loss (the lines are 2 wide)
NEWEST_OPACITY = 0.3  # pale enough that the lines drawn over it read through
LABEL_FIELDS = 3  # changed fields named in a label before "+N more"
# Never named in a label: the vocabulary follows the dataset (which is named), and the
# cadence is what `auto_config` derives from the step count (max_steps is named) or sets.
# The quick fields whose flip alone leaves no gap a learner can see at the Playground's start
# (the playground preset, DEFAULT_STEPS steps), each with what was measured there
# (`benchmarks/playground_fields.py`; docs/pages.md has the table). The page shows each
# under its field while the sidebar holds that preset.
NO_GAP_NOTES: dict[str, str] = {
    "norm_type": "At the playground preset (800 steps, seeds 1–3) RMSNorm ends within 0.03 "
    "nats of LayerNorm and BatchNorm 0.04–0.09 lower: too close to tell apart here.",
    "ffn": "At the playground preset (800 steps, seeds 1–3) FFN off ends 0.00–0.05 nats "
    "above FFN on: too close to tell apart here, while attention off costs 0.25.",
    "activation": "At the playground preset (800 steps, seeds 1–3) ReLU's gap to GELU "
    "changes sign with the seed (−0.01 to +0.20 nats) and SiLU's stays within 0.04; "
    "SwiGLU ends 0.05–0.15 lower.",
    "n_layer": "At the playground preset (800 steps, seeds 1–3) 2 layers end within 0.07 "
    "nats of 4 (−0.07 to +0.01): a run this short gains nothing visible from depth.",
}


def no_gap_note(name: str, run_config: RunConfig | None, fields: tuple[str, ...]) -> str | None:
    """The measured note under field `name`, while it describes what the page holds: every
    other field of `fields` at the playground preset's value (the note measured flipping
    `name` alone; once another field is flipped, it no longer says what this flip does)."""
    if name not in NO_GAP_NOTES or run_config is None:
        return None
    start = config.preset(PLAYGROUND_PRESET)
    for other in fields:
        section = config.section_of(other)
        ours = getattr(getattr(run_config, section), other)
        if other != name and ours != getattr(getattr(start, section), other):
            return None
    return NO_GAP_NOTES[name]


UNLABELLED = frozenset(
    {"vocab_size", "eval_interval", "probe_interval", "sample_interval", "ckpt_interval"}
)


def auto_config(run_config: RunConfig, steps: int) -> RunConfig:
    """The sidebar's config trained for `steps` steps, with its cadence scaled to fit.

    Everything the user set stays, except: `max_steps` is `steps` (so the learning-rate
    schedule spans those steps), warm-up is capped at them, there are EVALS_PER_RUN
    evaluations of at most MAX_EVAL_ITERS batches, probes and samples run only at the
    first and last step (the loss is what the Playground draws), and no fork points are
    kept (`ckpt_interval` 0: the Playground neither forks nor replays, and a throwaway run
    need not keep a checkpoint per interval); last.ckpt and best.ckpt are still written.
    """
    train = run_config.train
    return config.replace(
        run_config,
        max_steps=steps,
        warmup_steps=min(train.warmup_steps, steps),
        eval_interval=max(1, steps // EVALS_PER_RUN),
        eval_iters=min(train.eval_iters, MAX_EVAL_ITERS),
        probe_interval=steps,
        sample_interval=steps,
        ckpt_interval=0,
    ).validate()


def _shown(value: Any) -> str:
    """A config value as a label shows it: on / off, auto for None, numbers as typed."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _changes(previous: RunConfig, current: RunConfig, short: bool) -> list[str]:
    """Each labelled field that differs: "name=new" (short) or "name: old → new"."""
    return [
        f"{name}={_shown(new)}" if short else f"{name}: {_shown(old)} → {_shown(new)}"
        for name, (old, new) in config.diff(previous, current).items()
        if name not in UNLABELLED
    ]


def _joined(changes: list[str]) -> str:
    """Up to LABEL_FIELDS changes joined by ", ", then "+N more"."""
    shown = ", ".join(changes[:LABEL_FIELDS])
    more = len(changes) - LABEL_FIELDS
    return f"{shown}, +{more} more" if more > 0 else shown


def change_label(
    previous: RunConfig | None, current: RunConfig, start: str, short: bool = False
) -> str:
    """What changed from `previous` to `current`, in a few words.

    The first run of a trail says what it is: "start: <preset>", and what differs from
    that preset as an auto-run would train it ("start: tiny + d_model: 32 → 64"). Later
    runs say what changed from the one before: "norm_position: pre → post" for one change,
    up to LABEL_FIELDS changes joined by ", " and "+N more" after them, "no change" when
    the configs are equal (the switch turned off and on again). `short` drops the old
    values ("norm_position=post"): the chart's legend cuts long labels.
    """
    if previous is None:
        if start not in PRESETS:
            return f"start: {start}"
        steps = current.train.max_steps
        # Both as an auto-run trains them: only what the user changed is named.
        base = auto_config(config.preset(start), steps)
        changes = _changes(base, auto_config(current, steps), short)
        return f"start: {start} + {_joined(changes)}" if changes else f"start: {start}"
    changes = _changes(previous, current, short)
    return _joined(changes) if changes else "no change"


@dataclass(frozen=True)
class Pending:
    """The config the sidebar holds now (as JSON) and since when it has held it."""

    config_json: str
    since: float


def observe(pending: Pending | None, config_json: str, now: float) -> Pending:
    """The pending config after seeing `config_json` at `now`: the clock restarts on a change."""
    if pending is not None and pending.config_json == config_json:
        return pending
    return Pending(config_json, now)


def should_launch(
    pending: Pending, now: float, last_launched: str | None, debounce_s: float = DEBOUNCE_S
) -> bool:
    """Launch when the pending config differs from the last one launched and has been
    unchanged for `debounce_s` (a number input changes on every click of its arrows)."""
    return pending.config_json != last_launched and now - pending.since >= debounce_s


@dataclass(frozen=True)
class TrailEntry:
    """One auto-run on the chart: its run id, what changed, and the config it trained."""

    run_id: int
    label: str  # change_label's, for the trail's lines
    short: str  # change_label's short one, for the chart's legend
    config_json: str  # the config it trained (`auto_config`'s), for the next label


def add_to_trail(trail: list[TrailEntry], entry: TrailEntry, length: int) -> list[TrailEntry]:
    """The trail with `entry` appended, keeping only the newest `length` entries."""
    if length < 1:
        raise ValueError(f"trail length: {length!r} is not allowed; must be at least 1")
    return [*trail, entry][-length:]


def trail_lines(trail: list[TrailEntry]) -> dict[int, str]:
    """run id -> the line under the chart: '#id label', the newest marked as such."""
    out = {entry.run_id: f"#{entry.run_id} {entry.label}" for entry in trail}
    if trail:
        out[trail[-1].run_id] += " (newest)"
    return out


def legend_labels(trail: list[TrailEntry]) -> dict[int, str]:
    """run id -> the run's name on the chart: '#id short label' (fits the legend)."""
    return {entry.run_id: f"#{entry.run_id} {entry.short}" for entry in trail}


def trail_chart(scalars: pd.DataFrame, trail: list[TrailEntry]) -> alt.LayerChart:
    """The trail's loss curves (charts.loss_chart, runs named by `legend_labels`), the
    newest run's train loss marked by a wide pale halo drawn *under* every line, so a
    newer curve that lands on an older one never hides it."""
    labels = legend_labels(trail)
    if not scalars.empty:
        scalars = scalars.assign(run=scalars["run_id"].map(labels).astype(str))
    colors = charts.run_color_scale(labels)
    chart = charts.loss_chart(scalars, colors=colors, title=TRAIL_TITLE)
    data = charts.chart_data(chart)
    if not trail or data.empty:
        return chart
    newest = labels[trail[-1].run_id]
    halo = (
        alt.Chart()
        .mark_line(strokeWidth=NEWEST_WIDTH, opacity=NEWEST_OPACITY)
        .encode(
            x="step:Q",
            y="smoothed:Q",
            # As loss_chart's own: this layer comes first, and a legend=None here would
            # drop the runs' legend from the whole chart.
            color=alt.Color("run:N", title="run", scale=colors, legend=charts.wrapped_legend()),
        )
        # Field predicates, not expressions: a label may hold any character.
        .transform_filter(alt.FieldEqualPredicate(field="run", equal=newest))
        .transform_filter(alt.FieldEqualPredicate(field="name", equal=spec.LOSS_NAMES[0]))
    )
    # A copy keeps the top-level params (legend highlight, zoom) that Altair lifted out of
    # the layers when loss_chart built it; a new LayerChart would lose them.
    combined = chart.copy(deep=False)
    combined.layer = [halo, *chart.layer]
    return combined
