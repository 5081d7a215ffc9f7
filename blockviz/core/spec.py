"""The vocabulary of blockviz: every name a run writes and every label a view shows.

Model, probes, store, charts, export, pages and the CLI all take their names from here,
so a tap, a statistic or a metric is spelled once and labelled once. Torch-free.

Layers are numbered the way the store files them: -1 is the embeddings (token and
position), 0 .. n_layer-1 the blocks, n_layer the head end (final norm + LM head).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from blockviz.core.config_model import ModelConfig

# ------------------------------------------------------------------------- run status

STATUSES = ("queued", "running", "completed", "diverged", "failed", "stopped")
ACTIVE_STATUSES = ("queued", "running")  # a process is (or will be) working on the run
FINISHED_STATUSES = ("completed", "diverged")  # the run ran its course (not cut short)
# A queued run is only waiting while the running slots are taken; until its process has
# claimed a free slot (it first imports torch and Lightning and loads the data) the pages
# call it "starting", never "waiting".
STARTING = "starting"
WAITING_FOR_SLOT = "waiting for a free slot"
# The one table of the words a run's state is shown by, with what each means: Live's
# picker and header, Compare's picker, the Runs table and summary, Train's progress, the
# Playground and the CLI's `runs` and `show` all word a run through `shown_status` and this
# table (docs/pages.md lists it). The stored statuses, with a queued run split in two.
RUN_STATES = {
    STARTING: "its process is getting ready (importing torch, loading the data); a slot is "
    "free for it",
    "queued": f"{WAITING_FOR_SLOT}: it starts when a running run ends (a study's run: when "
    "one of its workers claims it)",
    "running": "training",
    "completed": "trained to its last step",
    "diverged": "its loss became non-finite, so training stopped",
    "failed": "its process ended with an error, or died",
    "stopped": "stopped before its last step (Resume continues it)",
}


def shown_status(status: str, ahead: int, max_running: int) -> str:
    """The status a page shows: a queued run reads `starting` unless every slot is spoken for.

    `ahead` counts the running runs plus the queued runs launched before this one; a
    `max_running` of 0 or less means no limit. Every other status is shown as it is.
    """
    if status != "queued":
        return status
    return STARTING if max_running <= 0 or ahead < max_running else status


# ------------------------------------------------------------------------------ taps

# Named identity modules in every block, where probes read activations (in forward order).
TAPS = (
    "resid_pre",  # the stream entering the block
    "norm1_out",  # output of the attention sublayer's norm (Pre-LN: its input; Post-LN: after)
    "attn_out",  # attention branch output, before residual scaling and the skip add
    "resid_mid",  # the stream between attention and FFN (Post-LN: after norm1)
    "norm2_out",  # output of the FFN sublayer's norm
    "ffn_hidden",  # FFN hidden activations after the nonlinearity / gating, (B, T, d_ff)
    "ffn_out",  # FFN branch output, before residual scaling and the skip add
    "resid_post",  # the stream leaving the block
)


def block_tap_names(cfg: ModelConfig) -> tuple[str, ...]:
    """The taps a block of this config has, in forward order.

    resid_pre and resid_post always exist. attn_out exists iff attention is on, ffn_hidden
    and ffn_out iff the FFN is on; norm1_out / norm2_out also need a norm (norm_position
    pre or post); resid_mid needs both sublayers (with one of them off there is no "between").
    The model builds exactly these (absent taps are absent, never silent pass-throughs).
    """
    has_norm = cfg.norm_position != "none"
    present = {
        "resid_pre": True,
        "norm1_out": cfg.attention and has_norm,
        "attn_out": cfg.attention,
        "resid_mid": cfg.attention and cfg.ffn,
        "norm2_out": cfg.ffn and has_norm,
        "ffn_hidden": cfg.ffn,
        "ffn_out": cfg.ffn,
        "resid_post": True,
    }
    return tuple(name for name in TAPS if present[name])


def number_label(value: float) -> str:
    """A number as labels write it, with a true minus sign: -8.0 -> "−8"."""
    return f"{value:g}".replace("-", "−")


HIST_BINS = 64  # equal-width bins of each tap's histogram
# The histogram's fixed value range. Its bins count only the values inside it; the
# fractions of values below and above it are tap statistics of their own (below_range,
# above_range), so a value of 10 is never drawn as if it lay in the last bin.
HIST_RANGE = (-8.0, 8.0)
# Statistics of one tap's activation (TAP_STATS), of the stream leaving each block
# (STREAM_STATS, at its STREAM_TAP only) and of the FFN's hidden units (FFN_UNIT_STATS, at
# FFN_TAP only) are metrics of the registry below.
STREAM_TAP = "resid_post"
FFN_TAP = "ffn_hidden"

# ----------------------------------------------------------------- per-layer records

# `layer_stats.kind`: what a row's `component` column names.
LAYER_KINDS = ("component", "param", "tap", "head")
# Parts of the model that gradient statistics are summed over (kind "component").
# "block" is a whole block (or the whole embedding / head end). "weights" is a layer's
# weight matrices only (its 2-D tensors: the Linear weights, and at layer -1 the embedding
# tables): the norm gains start at ones (‖γ‖² = d) and would dilute the layer's update
# ratio, so that view reads the matrices alone; norms and biases keep their own groups.
COMPONENTS = ("attn", "ffn", "norm", "embed", "head", "block", "weights")
WEIGHTS_COMPONENT = "weights"
# What the two components that cut across the others hold, for titles and captions.
COMPONENT_LABELS = {
    "block": "every tensor of the layer",
    "weights": "the layer's weight matrices only",
}
# Parameter groups of the closed-form breakdown (params.py), and the component each
# belongs to: the breakdown is finer than the probes' components, never different.
PARAM_GROUPS = {
    "token_embedding": "embed",
    "position_embedding": "embed",
    "attn_qkv": "attn",
    "attn_qk_norm": "attn",  # qk_norm's q_norm and k_norm, filed under attn as probes do
    "attn_out": "attn",
    "ffn_in": "ffn",
    "ffn_out": "ffn",
    "norm1": "norm",
    "norm2": "norm",
    "final_norm": "norm",
    "lm_head": "head",
}

# --------------------------------------------------------------------------- metrics

# Every series a run records is a metric of METRICS below: its name as the store files it
# (the `scalars` table's `name`, the `layer_stats` table's `stat`), its axis title, its
# unit and its family. Code names a metric by the constant beside it (spec.TRAIN_LOSS,
# spec.GRAD_NORM, ...), never by a literal; tests/core/test_vocabulary.py holds that.

# What a metric measures.
FAMILIES = (
    "loss",
    "accuracy",
    "optimizer",
    "throughput",
    "gradient",
    "parameter",
    "update",
    "activation",
    "attention",
    "logits",
    "induction",
)
# Where a metric is recorded, and of what:
# - scalar: a series of the `scalars` table, one value a logged step;
# - component: `layer_stats` of kinds component and param (parameter groups, tensors);
# - tap: `layer_stats` of kind tap, at every tap of every block;
# - stream: kind tap, at each block's STREAM_TAP only;
# - units: kind tap, at each block's FFN_TAP only;
# - head: `layer_stats` of kind head, per layer and attention head.
SCOPES = ("scalar", "component", "tap", "stream", "units", "head")


@dataclass(frozen=True)
class Metric:
    """One recorded series: its name, axis title (units included), unit ("" for none),
    family (FAMILIES) and scope (SCOPES)."""

    name: str
    label: str
    unit: str
    family: str
    scope: str


# Scalars of every logged training step.
TRAIN_LOSS = "train/loss"  # the cross-entropy (with z-loss on, without its term)
TRAIN_LR = "train/lr"
TRAIN_STEP_TIME = "train/step_time"
TRAIN_TOKENS_PER_SEC = "train/tokens_per_sec"
# seconds from the first training step to the end of the logged step, validation
# included; it restarts at 0 when a run is resumed
TRAIN_ELAPSED_S = "train/elapsed_s"
# Scalars of every evaluation.
VAL_LOSS = "val/loss"
VAL_BPC = "val/bpc"
VAL_PPL = "val/ppl"
VAL_ANSWER_ACC = "val/answer_acc"  # ops only
# the same answers, by copying first/last's argument, else the op's most frequent answer
VAL_ANSWER_BASELINE = "val/answer_baseline"
# Scalars of every probe step: the global gradient norm (before clipping) and, of the
# output logits on the probe batch, the largest |logit| and the mean over positions of
# log Z = logsumexp over the vocabulary (what z-loss penalises).
TRAIN_GRAD_NORM = "train/grad_norm"
PROBE_LOGIT_MAX_ABS = "probe/logit_max_abs"
PROBE_LOG_Z = "probe/log_z"

# Per parameter tensor and component group, at probe steps.
GRAD_NORM = "grad_norm"
PARAM_NORM = "param_norm"
UPDATE_RATIO = "update_ratio"  # ||delta theta|| / ||theta|| of the optimizer step
# Of one tap's activation, in the order a probe computes them (below_range and
# above_range: the fractions of values outside HIST_RANGE).
MEAN = "mean"
STD = "std"
RMS = "rms"
MAX_ABS = "max_abs"
ZERO_FRAC = "zero_frac"
BELOW_RANGE = "below_range"
ABOVE_RANGE = "above_range"
# Of the residual stream leaving each block (its STREAM_TAP only):
# - token_cos: the mean cosine similarity of two different positions' vectors in one
#   probe window; near 1, every token carries the same vector (rank collapse, Noci et
#   al. 2022);
# - max_over_median: the largest |activation| over the median |activation| of the tap on
#   the probe batch (massive activations, Sun et al. 2024).
TOKEN_COS = "token_cos"
MAX_OVER_MEDIAN = "max_over_median"
# Of the FFN's hidden units (FFN_TAP, after the nonlinearity): the fraction that are
# exactly zero for every token of the probe batch (dead units; stricter than zero_frac,
# which counts zero values, not units).
DEAD_FRAC = "dead_frac"
# Per attention head, on the probe batch: the mean entropy of its rows; its largest
# pre-softmax logit q·k/sqrt(head_dim), signed (attn_logit_max: a head whose logits grow
# large and negative keeps it small); and its largest |q·k/sqrt(head_dim)|
# (attn_logit_max_abs, what the attention-logit growth finding reads; Dehghani et al.
# 2023). Runs recorded before attn_logit_max_abs existed have only the signed one.
ATTN_ENTROPY = "attn_entropy"
ATTN_LOGIT_MAX = "attn_logit_max"
ATTN_LOGIT_MAX_ABS = "attn_logit_max_abs"
# Per attention head, of induction (training/induction.py; Olsson et al. 2022):
# prefix_score, its mean attention from the queries of the second repeat of a fixed batch of
# repeated random sequences to the token after the query token's previous occurrence
# (uniform attention: about ln 2 / (block_size // 2)); prefix_score_se, its standard error
# over the batch's rows; copy_score, Σ Re λ / Σ |λ| over the
# eigenvalues of its OV circuit W_U·W_O·W_V·W_E (Elhage et al. 2021), in [−1, 1]. And a
# probe scalar: that batch's mean loss on its first repeat minus on its second (nats).
# Runs recorded before prefix_score_se existed scored 4 rows and have no standard error.
PREFIX_SCORE = "prefix_score"
PREFIX_SCORE_SE = "prefix_score_se"
COPY_SCORE = "copy_score"
PROBE_REPEAT_GAIN = "probe/repeat_gain"

_LO, _HI = (number_label(end) for end in HIST_RANGE)
# Every metric, scalars first (in this order everywhere a list of them is shown).
METRICS: dict[str, Metric] = {
    metric.name: metric
    for metric in (
        Metric(TRAIN_LOSS, "loss (nats/char)", "nats/char", "loss", "scalar"),
        Metric(VAL_LOSS, "loss (nats/char)", "nats/char", "loss", "scalar"),
        Metric(TRAIN_LR, "learning rate", "", "optimizer", "scalar"),
        Metric(TRAIN_STEP_TIME, "step time (s)", "s", "throughput", "scalar"),
        Metric(
            TRAIN_TOKENS_PER_SEC,
            "tokens/s (per logged interval)",
            "tokens/s",
            "throughput",
            "scalar",
        ),
        Metric(
            TRAIN_ELAPSED_S,
            "wall-clock time since training started (s)",
            "s",
            "throughput",
            "scalar",
        ),
        Metric(TRAIN_GRAD_NORM, "gradient L2 norm", "", "gradient", "scalar"),
        Metric(VAL_BPC, "bits per char", "bits/char", "loss", "scalar"),
        Metric(VAL_PPL, "perplexity", "", "loss", "scalar"),
        Metric(VAL_ANSWER_ACC, "answer accuracy (fraction)", "fraction", "accuracy", "scalar"),
        Metric(
            VAL_ANSWER_BASELINE,
            "trivial baseline's answer accuracy (fraction)",
            "fraction",
            "accuracy",
            "scalar",
        ),
        Metric(PROBE_LOGIT_MAX_ABS, "output logits: largest |logit|", "", "logits", "scalar"),
        Metric(PROBE_LOG_Z, "output logits: mean log Z", "nats", "logits", "scalar"),
        Metric(
            PROBE_REPEAT_GAIN,
            "repeated random text: loss on 1st − on 2nd repeat (nats)",
            "nats",
            "induction",
            "scalar",
        ),
        Metric(GRAD_NORM, "gradient L2 norm", "", "gradient", "component"),
        Metric(PARAM_NORM, "parameter L2 norm", "", "parameter", "component"),
        Metric(UPDATE_RATIO, "‖Δθ‖/‖θ‖ per step", "", "update", "component"),
        Metric(MEAN, "activation mean", "", "activation", "tap"),
        Metric(STD, "activation std", "", "activation", "tap"),
        Metric(RMS, "activation RMS", "", "activation", "tap"),
        Metric(MAX_ABS, "activation max |x|", "", "activation", "tap"),
        Metric(ZERO_FRAC, "fraction of zeros", "fraction", "activation", "tap"),
        Metric(
            BELOW_RANGE,
            f"fraction below {_LO} (outside the histogram)",
            "fraction",
            "activation",
            "tap",
        ),
        Metric(
            ABOVE_RANGE,
            f"fraction above {_HI} (outside the histogram)",
            "fraction",
            "activation",
            "tap",
        ),
        Metric(ATTN_ENTROPY, "attention entropy (nats)", "nats", "attention", "head"),
        Metric(ATTN_LOGIT_MAX, "largest attention logit (before softmax)", "", "attention", "head"),
        Metric(
            ATTN_LOGIT_MAX_ABS,
            "largest |attention logit| (before softmax)",
            "",
            "attention",
            "head",
        ),
        Metric(PREFIX_SCORE, "prefix-matching score (induction)", "fraction", "induction", "head"),
        Metric(
            PREFIX_SCORE_SE,
            "prefix-matching score's standard error over rows",
            "fraction",
            "induction",
            "head",
        ),
        Metric(COPY_SCORE, "copying score (OV eigenvalues, −1 to 1)", "", "induction", "head"),
        Metric(TOKEN_COS, "mean cosine similarity between positions", "", "activation", "stream"),
        Metric(MAX_OVER_MEDIAN, "largest / median |activation|", "", "activation", "stream"),
        Metric(
            DEAD_FRAC,
            "fraction of FFN units zero on every probe token",
            "fraction",
            "activation",
            "units",
        ),
    )
}


def metric_names(scope: str | None = None, family: str | None = None) -> tuple[str, ...]:
    """The names of the metrics of a scope and/or family, in METRICS' order."""
    return tuple(
        m.name
        for m in METRICS.values()
        if (scope is None or m.scope == scope) and (family is None or m.family == family)
    )


# The registry's views that code reads (each derived from METRICS, in its order).
TAP_STATS = metric_names("tap")  # mean, std, rms, max_abs, zero_frac, below/above_range
STREAM_STATS = metric_names("stream")  # token_cos, max_over_median
FFN_UNIT_STATS = metric_names("units")  # dead_frac
COMPONENT_STATS = metric_names("component")  # grad_norm, param_norm, update_ratio
HEAD_STATS = metric_names("head")  # ATTENTION_HEAD_STATS, then INDUCTION_STATS
ATTENTION_HEAD_STATS = metric_names("head", "attention")  # attn_entropy, attn_logit_max(_abs)
INDUCTION_STATS = metric_names("head", "induction")  # prefix_score(_se), copy_score
# Head statistics drawn on a log axis (the others are bounded scores or entropies).
LOG_HEAD_STATS = (ATTN_LOGIT_MAX, ATTN_LOGIT_MAX_ABS)
# Live's Activations tab: every tap's statistics, then the stream's and the FFN units'.
ACTIVATION_STATS = (*TAP_STATS, *STREAM_STATS, *FFN_UNIT_STATS)
NORM_STATS = (GRAD_NORM, PARAM_NORM)  # Live's Gradients tab
# Scalars a probe step records besides the global gradient norm.
PROBE_SCALARS = metric_names("scalar", "logits")  # probe/logit_max_abs, probe/log_z
LOSS_NAMES = (TRAIN_LOSS, VAL_LOSS)  # the loss chart's two series
# What an evaluation records (lit.val_metrics), at the step after whose updates it ran.
EVAL_SCALARS = (VAL_LOSS, VAL_BPC, VAL_PPL, VAL_ANSWER_ACC, VAL_ANSWER_BASELINE)
# Scalar series names and their axis titles; per-layer statistics and theirs.
SCALARS = {m.name: m.label for m in METRICS.values() if m.scope == "scalar"}
STAT_LABELS = {m.name: m.label for m in METRICS.values() if m.scope != "scalar"}

# Two throughputs, named apart everywhere: Live's header shows the recent one (median of
# the last RECENT_LOGS logged train/tokens_per_sec values, robust to the slow probe steps);
# the final metrics' `tokens_per_sec` is the mean over training (tokens seen / training
# time, probe steps included, evaluations excluded).
RECENT_LOGS = 50
RECENT_TOKENS_PER_SEC = "Recent tokens/s"
RECENT_TOKENS_PER_SEC_HELP = (
    f"Median of the last {RECENT_LOGS} logged throughputs ({TRAIN_TOKENS_PER_SEC}). "
    "Compare, `show` and the report give the mean tokens/s over training instead."
)


def scalar_label(name: str) -> str:
    """Axis title of a scalar series (its name when unknown)."""
    metric = METRICS.get(name)
    return metric.label if metric is not None and metric.scope == "scalar" else name


def component_label(component: str) -> str:
    """What a component group holds, in words (its name when it needs none)."""
    return COMPONENT_LABELS.get(component, component)


def stat_label(stat: str) -> str:
    """Axis title of a per-layer statistic (its name when unknown)."""
    metric = METRICS.get(stat)
    return metric.label if metric is not None and metric.scope != "scalar" else stat


# ---------------------------------------------------------------------- final metrics


@dataclass(frozen=True)
class FinalColumn:
    """A column of the final-metrics (ablation) table: its header, how to show it, and
    its `short` header where a narrow table (Compare's) needs one."""

    header: str
    kind: str = "number"  # number | integer | text | percent | count | duration
    digits: int = 4
    short: str = ""

    @property
    def label(self) -> str:
        """The short header, else the header."""
        return self.short or self.header


# In the order of `RunStore.final_metrics`; every view of that table uses these headers.
FINAL_COLUMNS = {
    "run": FinalColumn("run", "text"),
    "status": FinalColumn("status", "text"),
    "steps": FinalColumn("steps", "integer"),
    # The final train loss averages the last 50 steps' losses (TrainingMonitor's
    # RECENT_LOSSES): one batch's loss is too noisy to report alone.
    "train_loss": FinalColumn("train loss (mean of last 50 steps)", short="train loss"),
    "val_loss": FinalColumn("val loss"),
    "val_ppl": FinalColumn("val perplexity", digits=2, short="val ppl"),
    "val_bpc": FinalColumn("val bits/char", digits=3, short="val bpc"),
    "answer_acc": FinalColumn("answer accuracy", "percent", short="answers"),
    "answer_baseline": FinalColumn(
        "trivial baseline's answer accuracy", "percent", short="baseline"
    ),
    "diverged_at": FinalColumn("diverged at step", "integer", short="diverged at"),
    "time_s": FinalColumn("time (s)", "duration", digits=1, short="time"),
    "tokens_per_sec": FinalColumn("mean tokens/s over training", digits=0, short="tokens/s"),
    "n_params": FinalColumn("parameters", "count", short="params"),
}


def final_header(column: str) -> str:
    """Header of a final-metrics column (its name when unknown)."""
    spec = FINAL_COLUMNS.get(column)
    return spec.header if spec else column


def final_text(final: dict[str, Any]) -> str:
    """A run's final metrics as one line (what `train` prints as a run ends), with the
    labels every view gives them (`show`, Compare, the report); the ones without a value
    left out."""
    return ", ".join(
        f"{final_header(key)} = {value:.4g}"
        if isinstance(value, float)
        else f"{final_header(key)} = {value}"
        for key, value in final.items()
        if value is not None
    )


# ---------------------------------------------------------------------------- layers

EMBED_LAYER = -1
LAYER_AXIS_TITLE = "layer (−1 = embeddings, last = final norm + head)"


def layer_label(layer: int, n_layer: int) -> str:
    """'embeddings', 'block 0', ..., 'head': one name for each layer number, everywhere."""
    if layer <= EMBED_LAYER:
        return "embeddings"
    if layer >= n_layer:
        return "head"
    return f"block {layer}"


def layer_tick(layer: int, n_layer: int) -> str:
    """A short axis tick or legend entry: 'embed', '0', '1', ..., 'head'."""
    if layer <= EMBED_LAYER:
        return "embed"
    if layer >= n_layer:
        return "head"
    return str(layer)


def and_list(items: Iterable[str]) -> str:
    """`a`, `a and b`, `a, b and c`: names in a sentence."""
    words = list(items)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
