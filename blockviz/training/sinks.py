"""Where probe records go: the run store, and Lightning's loggers (TensorBoard, CSV).

`BlockProbe` measures; a sink writes. Everything one probe step measured reaches every
sink as one `ProbeRecords`, already on the host, and each sink keeps what it can hold:

- `StoreSink` writes all of it into the run store (what the dashboard reads);
- `LoggerSink` writes the per-layer statistics as scalars to Lightning loggers, and, to a
  TensorBoard logger, the activation histograms and the text samples too, under the tags
  docs/internals.md lists (`stat_tag`: `grad_norm/block2/attn`, `act_rms/block0/resid_post`,
  `attn_entropy/block1/head0`, ...). Attention maps and per-tensor rows stay in the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from blockviz.core.spec import TRAIN_GRAD_NORM, layer_tick

if TYPE_CHECKING:
    from lightning.pytorch.loggers import Logger

    from blockviz.store import RunStore

# Layer-stat kinds LoggerSink sends by default: per-tensor ("param") rows would add three
# tags per parameter tensor, hundreds on a deep model; the dashboard has them.
LOGGED_KINDS = ("component", "tap", "head")


class LayerStat(NamedTuple):
    """One per-layer statistic: exactly a row of the store's `layer_stats` table."""

    step: int
    layer: int  # -1 embeddings, 0 .. n_layer-1 blocks, n_layer the head end
    kind: str  # spec.LAYER_KINDS: what `component` names
    component: str  # a component, a parameter name, a tap or a head number
    stat: str
    value: float


@dataclass(frozen=True)
class Histogram:
    """Equal-width bin counts of the tap's activations that lie in [lo, hi].

    Values outside are not counted here: the tap statistics below_range / above_range
    give their fractions.
    """

    layer: int
    tap: str
    lo: float
    hi: float
    counts: list[int]


@dataclass(frozen=True)
class AttentionMap:
    """One head's attention weights over the probe characters: weights[query][key]."""

    layer: int
    head: int
    tokens: list[str]
    weights: list[list[float]]


@dataclass(frozen=True)
class Sample:
    """Text generated after `prompt` (the prompt not included)."""

    prompt: str
    text: str


@dataclass
class ProbeRecords:
    """Everything one probe step measured, on the host, for every sink."""

    step: int
    n_layer: int  # so a sink can name layers (`layer_tag`)
    grad_norm: float | None = None  # global gradient L2 norm, before clipping
    scalars: dict[str, float] = field(default_factory=dict)  # spec.PROBE_SCALARS
    layer_stats: list[LayerStat] = field(default_factory=list)
    histograms: list[Histogram] = field(default_factory=list)
    attention: list[AttentionMap] = field(default_factory=list)
    sample: Sample | None = None


class ProbeSink(Protocol):
    """Something that takes probe records: the run store, Lightning loggers..."""

    def write(self, records: ProbeRecords) -> None:
        """Take (or buffer) one probe step's records."""

    def flush(self) -> None:
        """Make everything written so far durable (called when training ends)."""


class StoreSink:
    """All probe records into the run store: the rows the dashboard reads."""

    def __init__(self, store: RunStore, run_id: int) -> None:
        self.store = store
        self.run_id = run_id

    def write(self, records: ProbeRecords) -> None:
        """Buffer the step's scalar, histograms, layer stats, attention maps and sample."""
        run_id, step = self.run_id, records.step
        scalars = [(step, name, value) for name, value in records.scalars.items()]
        if records.grad_norm is not None:
            scalars.append((step, TRAIN_GRAD_NORM, records.grad_norm))
        if scalars:
            self.store.log_scalars(run_id, scalars)
        for hist in records.histograms:
            self.store.log_histogram(
                run_id, step, hist.layer, hist.tap, hist.lo, hist.hi, hist.counts
            )
        if records.layer_stats:
            self.store.log_layer_stats(run_id, records.layer_stats)
        for attention in records.attention:
            self.store.log_attention(
                run_id, step, attention.layer, attention.head, attention.tokens, attention.weights
            )
        if records.sample is not None:
            self.store.log_sample(run_id, step, records.sample.prompt, records.sample.text)

    def flush(self) -> None:
        """Write the buffered rows."""
        self.store.flush()


def layer_tag(layer: int, n_layer: int) -> str:
    """A layer as a tag part: `embed`, `block0`, ..., `head`."""
    tick = layer_tick(layer, n_layer)
    return f"block{tick}" if tick.isdigit() else tick


def stat_tag(row: LayerStat, n_layer: int) -> str:
    """The logger tag of one per-layer statistic: `{stat}/{layer}/{component}`, `act_` before
    a tap's statistic, `head{h}` for a head's."""
    layer = layer_tag(row.layer, n_layer)
    if row.kind == "tap":
        return f"act_{row.stat}/{layer}/{row.component}"
    if row.kind == "head":
        return f"{row.stat}/{layer}/head{row.component}"
    return f"{row.stat}/{layer}/{row.component}"


class LoggerSink:
    """Per-layer statistics as scalars to Lightning loggers; histograms to TensorBoard."""

    def __init__(self, loggers: Sequence[Logger], kinds: Sequence[str] = LOGGED_KINDS) -> None:
        self.loggers = list(loggers)
        self.kinds = frozenset(kinds)

    def write(self, records: ProbeRecords) -> None:
        """One `log_metrics` call per logger; histograms and samples to TensorBoard."""
        from lightning.pytorch.loggers import TensorBoardLogger

        metrics: dict[str, float] = dict(records.scalars)
        if records.grad_norm is not None:
            metrics[TRAIN_GRAD_NORM] = records.grad_norm
        for row in records.layer_stats:
            if row.kind in self.kinds:
                metrics[stat_tag(row, records.n_layer)] = row.value
        for logger in self.loggers:
            if metrics:
                logger.log_metrics(metrics, step=records.step)
            if isinstance(logger, TensorBoardLogger):
                _write_tensorboard_extras(logger.experiment, records)

    def flush(self) -> None:
        """Let each logger write what it buffers (CSV keeps rows in memory until then)."""
        for logger in self.loggers:
            logger.save()


def _write_tensorboard_extras(writer: Any, records: ProbeRecords) -> None:
    """Histograms as TensorBoard histograms, the sample as a preformatted text block, to a
    TensorBoardLogger's SummaryWriter."""
    for hist in records.histograms:
        bins = len(hist.counts)
        width = (hist.hi - hist.lo) / bins
        centres = [hist.lo + (i + 0.5) * width for i in range(bins)]
        # The probe keeps counts only: sum and sum of squares are taken at the bin centres.
        writer.add_histogram_raw(
            f"act_hist/{layer_tag(hist.layer, records.n_layer)}/{hist.tap}",
            min=hist.lo,
            max=hist.hi,
            num=sum(hist.counts),
            sum=sum(c * x for c, x in zip(hist.counts, centres, strict=True)),
            sum_squares=sum(c * x * x for c, x in zip(hist.counts, centres, strict=True)),
            bucket_limits=[hist.lo + (i + 1) * width for i in range(bins)],
            bucket_counts=list(hist.counts),
            global_step=records.step,
        )
    if records.sample is not None:
        # TensorBoard renders text as Markdown: indenting every line keeps it verbatim.
        text = records.sample.prompt + records.sample.text
        writer.add_text(
            "sample", "\n".join("    " + line for line in text.split("\n")), records.step
        )
