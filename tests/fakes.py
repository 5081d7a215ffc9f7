"""Fake runs for tests and benchmarks, with the shapes a real run of blockviz.training writes.

A real run (`python -m blockviz train`) decides which rows exist: the scalar names and the
steps that hold them, the (layer, kind, component, stat) records of each probe step, the
parameter tensors as CharTransformer names them, the taps a block of its config has, the
histograms, attention maps and samples. This module writes exactly those rows, derived
from the run's config through blockviz.core.spec and blockviz.core.params, without torch
(the page tests run torch-free); tests/test_fakes.py checks each shape against real runs
and the real model. A fake gives what one real tiny run cannot cheaply give: many runs,
many steps, a run that is running, queued, failed or diverged.

The values mean nothing. Every series is seeded noise around a constant of its statistic,
never a function of the layer, the step or the config, so no fake makes one configuration
look better than another or draws a depth profile. Only what holds by definition holds (a
component's norm is the root of its tensors' summed squares, val/bpc = val/loss / ln 2,
tokens/s = tokens per batch / step time), and a diverged run's last loss is +inf.
"""

from __future__ import annotations

import math
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from blockviz.core import config as cfg
from blockviz.core import corpora, evaluation, params, procs
from blockviz.core.config_model import ModelConfig
from blockviz.core.config_train import TrainConfig
from blockviz.core.induction import repeat_half
from blockviz.core.spec import (
    ABOVE_RANGE,
    ATTN_ENTROPY,
    ATTN_LOGIT_MAX,
    ATTN_LOGIT_MAX_ABS,
    BELOW_RANGE,
    COPY_SCORE,
    DEAD_FRAC,
    FFN_TAP,
    GRAD_NORM,
    HIST_BINS,
    HIST_RANGE,
    MAX_ABS,
    MAX_OVER_MEDIAN,
    MEAN,
    PARAM_GROUPS,
    PARAM_NORM,
    PREFIX_SCORE,
    PREFIX_SCORE_SE,
    PROBE_LOG_Z,
    PROBE_LOGIT_MAX_ABS,
    PROBE_REPEAT_GAIN,
    RMS,
    STD,
    STREAM_TAP,
    TAP_STATS,
    TOKEN_COS,
    TRAIN_ELAPSED_S,
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
    TRAIN_LR,
    TRAIN_STEP_TIME,
    TRAIN_TOKENS_PER_SEC,
    UPDATE_RATIO,
    VAL_BPC,
    VAL_LOSS,
    VAL_PPL,
    WEIGHTS_COMPONENT,
    ZERO_FRAC,
    block_tap_names,
)
from blockviz.core.vocab import CharVocab, check_split
from blockviz.store import RunStore

DEFAULT_STATUSES = ("completed", "running", "diverged", "failed")
# The text both the fakes and tests/real_runs.py's real runs are about: offline, small,
# with a newline (samples start from "\n", as on most corpora).
CORPUS = ("the quick brown fox jumps over the lazy dog. " * 3 + "\n") * 80
CORPUS_NAME = "fox.txt"
FAILED_ERROR = "RuntimeError: out of memory at step {step} (synthetic failure)"
# BlockProbe's defaults (blockviz.training.probes), which real runs record with.
PROBE_BATCH = 4  # sequences of the fixed probe batch
ATTENTION_CHARS = 48  # an attention map covers the first characters of probe sequence 0
SAMPLE_CHARS = 120  # characters generated per text sample
DEVICE, PRECISION = "cpu", "32-true"

# How far through max_steps each status gets before the run stops (its `step`).
PROGRESS = {"completed": 1.0, "stopped": 0.7, "running": 0.6, "diverged": 0.4, "failed": 0.3}

# Linear layers and norms of a block, in the order CharTransformer registers them, with
# the parameter group (core.params) each one is.
_BLOCK_MODULES = (
    ("norm1", "norm1"),
    ("attn.qkv", "attn_qkv"),
    ("attn.q_norm", "attn_qk_norm"),
    ("attn.k_norm", "attn_qk_norm"),
    ("attn.proj", "attn_out"),
    ("norm2", "norm2"),
    ("ffn.fc_in", "ffn_in"),
    ("ffn.fc_out", "ffn_out"),
)
_NORM_GROUPS = ("norm1", "norm2", "final_norm", "attn_qk_norm")


# ---------------------------------------------------------------- names a run writes


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor as a probe files it: its name, layer, component, and whether it
    is a matrix (2-D: a Linear weight or an embedding table), as the "weights" group sums."""

    name: str
    layer: int
    component: str
    matrix: bool


def param_tensors(model: ModelConfig) -> list[ParamTensor]:
    """CharTransformer(model)'s trainable tensors in `named_parameters` order, torch-free.

    Which groups exist comes from the closed-form breakdown (core.params), which component
    each belongs to from core.spec; a tied LM head is listed once, as tok_emb.weight.
    """
    groups = {(row.layer, row.component) for row in params.param_breakdown(model).rows}
    # LayerNorm and BatchNorm have a bias when `bias`; RMSNorm never (qk_norm's norms are
    # LayerNorms under batchnorm, which has the same rule).
    norm_bias = model.bias and model.norm_type != "rmsnorm"

    def tensors(layer: int, group: str, module: str) -> list[ParamTensor]:
        if (layer, group) not in groups:
            return []
        if group in ("token_embedding", "position_embedding"):
            suffixes = ("weight",)
        elif group == "lm_head":
            suffixes = () if model.tie_weights else ("weight",)  # the head never has a bias
        else:
            has_bias = norm_bias if group in _NORM_GROUPS else model.bias
            suffixes = ("weight", "bias") if has_bias else ("weight",)
        component = PARAM_GROUPS[group]
        # Norm gains and every bias are vectors; every other weight is a matrix.
        return [
            ParamTensor(
                f"{module}.{suffix}",
                layer,
                component,
                matrix=suffix == "weight" and group not in _NORM_GROUPS,
            )
            for suffix in suffixes
        ]

    found = tensors(-1, "token_embedding", "tok_emb") + tensors(-1, "position_embedding", "pos_emb")
    for layer in range(model.n_layer):
        for module, group in _BLOCK_MODULES:
            found += tensors(layer, group, f"blocks.{layer}.{module}")
    found += tensors(model.n_layer, "final_norm", "final_norm")
    found += tensors(model.n_layer, "lm_head", "lm_head")
    return found


@dataclass(frozen=True)
class FakeData:
    """The corpus a fake run trained on: its vocabulary, split and fingerprint."""

    text: str
    vocab: CharVocab
    n_train: int
    n_val: int
    fingerprint: dict[str, Any]

    @property
    def prompt(self) -> str:
        """The fixed prompt of text samples: a newline, or the text's first character."""
        return "\n" if "\n" in self.vocab else self.text[0]


def fake_data(val_fraction: float = 0.1, block_size: int = 64, windows: int = 240) -> FakeData:
    """CORPUS as CharDataModule splits and fingerprints it, scored on `windows` windows of
    the evaluation set (the default: eval_iters 20 × batch_size 12)."""
    n_train, n_val = check_split(len(CORPUS), val_fraction, block_size, CORPUS_NAME)
    vocab = CharVocab.from_text(CORPUS)
    corpus = corpora.Corpus(name=CORPUS_NAME, source=CORPUS_NAME, text=CORPUS)
    fingerprint = {
        **corpora.fingerprint(corpus, vocab, n_train, n_val),
        evaluation.KEY: evaluation.record(windows, block_size),
    }
    return FakeData(CORPUS, vocab, n_train, n_val, fingerprint)


# ------------------------------------------------------------- which steps hold rows


@dataclass(frozen=True)
class Timeline:
    """The steps holding each kind of row when a run has stopped at step `end`."""

    end: int
    train: list[int]  # train/loss, lr, step_time, tokens_per_sec, elapsed_s
    probes: list[int]  # layer stats, histograms and train/grad_norm
    vals: list[int]  # val/loss, val/bpc, val/ppl
    samples: list[int]  # text samples and attention maps
    diverged: bool


def timeline(train: TrainConfig, status: str, end: int) -> Timeline:
    """What LitCharModel and BlockProbe have logged by the time a run with `status` stops.

    `end` is the run's step: the updates done, or for a diverged run the step whose loss
    went non-finite. That step still ran its probes, but logged only its loss; validation
    at step k*eval_interval runs after update k*eval_interval - 1; a completed run ends with
    a validation at max_steps and a last sample there.
    """
    diverged = status == "diverged"
    ran = end + 1 if diverged else end  # batches that reached their probes
    last = train.max_steps - 1
    train_steps = [s for s in range(end) if s % train.log_interval == 0 or s == last]
    probes = [s for s in range(ran) if s % train.probe_interval == 0 or s == last]
    samples = [s for s in range(ran) if s % train.sample_interval == 0]
    vals = list(range(train.eval_interval, end + 1, train.eval_interval))
    if status == "completed":
        vals = sorted({*vals, train.max_steps})
        samples = sorted({*samples, train.max_steps})
    return Timeline(end, train_steps, probes, vals, samples, diverged)


# ------------------------------------------------------------------------- values


def _noise(seed: int, index: int, *key: object) -> np.random.Generator:
    """The generator of one series: fixed by seed, run index and the series' key only.

    The key never includes the config, so two runs that differ only in, say, the norm
    position get the very same numbers wherever both have a series.
    """
    digest = zlib.crc32("/".join(map(str, key)).encode("utf-8"))
    return np.random.default_rng([seed, index, digest])


# The fake activations' spread: wide enough that a small share (about 0.8%) falls outside
# HIST_RANGE, so the histogram's out-of-range note has something to show.
HIST_STD = 3.0


def _hist_probabilities() -> np.ndarray:
    """Chance of [below HIST_RANGE, each histogram bin, above it] for a normal of HIST_STD."""
    lo, hi = HIST_RANGE
    edges = np.linspace(lo, hi, HIST_BINS + 1) / HIST_STD
    cdf = np.array([0.0, *(0.5 * (1 + math.erf(edge / math.sqrt(2))) for edge in edges), 1.0])
    return np.diff(cdf)  # (HIST_BINS + 2,)


_HIST_P = _hist_probabilities()
LayerRow = tuple[int, int, str, str, str, float]  # (step, layer, kind, component, stat, value)


class _FakeRun:
    """The rows of one fake run, from its config, status and stopping step."""

    def __init__(self, config: cfg.RunConfig, timeline: Timeline, seed: int, index: int) -> None:
        self.config = config
        self.model = config.model
        self.train = config.train
        self.timeline = timeline
        self.seed = seed
        self.index = index
        windows = self.train.eval_iters * self.train.batch_size
        self.data = fake_data(config.data.val_fraction, self.model.block_size, windows)

    def rng(self, *key: object) -> np.random.Generator:
        return _noise(self.seed, self.index, *key)

    # -- scalars -------------------------------------------------------------------------

    def scalar_rows(self, global_grad: np.ndarray) -> list[tuple[int, str, float]]:
        """Train rows, train/grad_norm at probe steps, validation rows."""
        line = self.timeline
        steps = line.train
        n = len(steps)
        loss = 2.5 + 0.1 * self.rng(TRAIN_LOSS).standard_normal(n)
        step_time = 0.05 * np.exp(0.1 * self.rng(TRAIN_STEP_TIME).standard_normal(n))
        tokens = self.train.batch_size * self.model.block_size
        rows: list[tuple[int, str, float]] = []
        for name, values in (
            (TRAIN_LOSS, loss),
            (TRAIN_LR, np.full(n, self.train.lr)),
            (TRAIN_STEP_TIME, step_time),
            (TRAIN_TOKENS_PER_SEC, tokens / step_time),
            # a clock: each logged window's steps times their step time, added up
            (TRAIN_ELAPSED_S, np.cumsum(step_time * np.diff(steps, prepend=-1))),
        ):
            rows += zip(steps, repeat(name), values.tolist(), strict=False)
        if line.diverged:
            rows.append((line.end, TRAIN_LOSS, math.inf))
        rows += zip(line.probes, repeat(TRAIN_GRAD_NORM), global_grad.tolist(), strict=False)
        size = len(line.probes)
        for name, level in ((PROBE_LOGIT_MAX_ABS, 5.0), (PROBE_LOG_Z, 4.5)):
            values = level * np.exp(0.1 * self.rng(name).standard_normal(size))
            rows += zip(line.probes, repeat(name), values.tolist(), strict=False)
        if self.has_induction():
            gain = 0.1 * self.rng(PROBE_REPEAT_GAIN).standard_normal(size)
            rows += zip(line.probes, repeat(PROBE_REPEAT_GAIN), gain.tolist(), strict=False)
        val_loss = 2.6 + 0.1 * self.rng(VAL_LOSS).standard_normal(len(line.vals))
        for name, values in (
            (VAL_LOSS, val_loss),
            (VAL_BPC, val_loss / math.log(2)),
            (VAL_PPL, np.exp(val_loss)),
        ):
            rows += zip(line.vals, repeat(name), values.tolist(), strict=False)
        return rows

    # -- probes --------------------------------------------------------------------------

    def norm_rows(self) -> tuple[list[LayerRow], np.ndarray]:
        """Per-tensor, per-component and per-layer norms and update ratios; and the global
        gradient norm per probe step (the root of the summed squares, as BlockProbe has it)."""
        size = len(self.timeline.probes)
        rows: list[LayerRow] = []
        groups: dict[tuple[int, str], np.ndarray] = {}  # (layer, component) -> (3, S) squares
        for tensor in param_tensors(self.model):
            draws = self.rng("param", tensor.name).standard_normal((3, size))
            grad = 0.3 * np.exp(0.5 * draws[0])
            param = 4.0 * np.exp(0.2 * draws[1])
            delta = param * 1e-3 * np.exp(0.5 * draws[2])
            rows += self._norms(tensor.layer, "param", tensor.name, grad, param, delta)
            squares = np.stack([grad, param, delta]) ** 2
            keys = [(tensor.layer, tensor.component), (tensor.layer, "block")]
            if tensor.matrix:
                keys.append((tensor.layer, WEIGHTS_COMPONENT))
            for key in keys:
                groups[key] = groups.get(key, 0) + squares
        for (layer, component), squares in sorted(groups.items()):
            rows += self._norms(layer, "component", component, *np.sqrt(squares))
        total = sum(squares[0] for (_, part), squares in groups.items() if part == "block")
        return rows, np.sqrt(total) if size else np.zeros(0)

    def _norms(
        self, layer: int, kind: str, component: str, grad: Any, param: Any, delta: Any
    ) -> list[LayerRow]:
        return [
            *self._rows(layer, kind, component, GRAD_NORM, grad),
            *self._rows(layer, kind, component, PARAM_NORM, param),
            *self._rows(layer, kind, component, UPDATE_RATIO, delta / param),
        ]

    def _rows(
        self, layer: int, kind: str, component: str, stat: str, values: np.ndarray
    ) -> list[LayerRow]:
        """One statistic's rows over the probe steps."""
        pairs = zip(self.timeline.probes, values.tolist(), strict=True)
        return [(step, layer, kind, component, stat, value) for step, value in pairs]

    def tap_and_head_rows(self) -> list[LayerRow]:
        """Activation statistics of every tap and the attention entropy of every head."""
        size = len(self.timeline.probes)
        rows: list[LayerRow] = []
        for layer in range(self.model.n_layer):
            for tap in block_tap_names(self.model):
                draws = self.rng("tap", layer, tap).standard_normal((3, size))
                mean = 0.05 * draws[0]
                std = np.exp(0.3 * draws[1])
                rms = np.sqrt(mean**2 + std**2)
                stats = {
                    MEAN: mean,
                    STD: std,
                    RMS: rms,
                    MAX_ABS: rms * (4 + draws[2].clip(-2, 2)),
                    ZERO_FRAC: np.zeros(size),
                }
                # The shares outside the histogram's range, from the histogram's own draws.
                counts = self.tap_counts(layer, tap)
                stats[BELOW_RANGE] = counts[:, 0] / self.tap_size(tap)
                stats[ABOVE_RANGE] = counts[:, -1] / self.tap_size(tap)
                for stat in TAP_STATS:
                    rows += self._rows(layer, "tap", tap, stat, stats[stat])
                extra = self.rng("tap extras", layer, tap)
                if tap == STREAM_TAP:
                    rows += self._rows(layer, "tap", tap, TOKEN_COS, extra.uniform(0.1, 0.5, size))
                    ratio = 6 * np.exp(0.1 * extra.standard_normal(size))
                    rows += self._rows(layer, "tap", tap, MAX_OVER_MEDIAN, ratio)
                if tap == FFN_TAP:
                    rows += self._rows(layer, "tap", tap, DEAD_FRAC, np.zeros(size))
            if self.model.attention:
                top = math.log(self.model.block_size)  # the most a causal row can have
                for head in range(self.model.n_head):
                    draws = self.rng("head", layer, head)
                    entropy = top * draws.uniform(0.2, 0.9, size)
                    rows += self._rows(layer, "head", str(head), ATTN_ENTROPY, entropy)
                    logits = 5 * np.exp(0.2 * draws.standard_normal(size))
                    rows += self._rows(layer, "head", str(head), ATTN_LOGIT_MAX, logits)
                    # The largest |logit| is at least the largest logit.
                    widest = logits * np.exp(0.1 * np.abs(draws.standard_normal(size)))
                    rows += self._rows(layer, "head", str(head), ATTN_LOGIT_MAX_ABS, widest)
                    if self.has_induction():  # no head forms: at most 0.05
                        prefix = draws.uniform(0.0, 0.05, size)
                        rows += self._rows(layer, "head", str(head), PREFIX_SCORE, prefix)
                        error = draws.uniform(0.001, 0.01, size)  # over the batch's rows
                        rows += self._rows(layer, "head", str(head), PREFIX_SCORE_SE, error)
                        copying = draws.uniform(-0.5, 0.5, size)
                        rows += self._rows(layer, "head", str(head), COPY_SCORE, copying)
        return rows

    def has_induction(self) -> bool:
        """Whether the probe records the induction statistics: attention on, and halves of
        at least 2 tokens in the repeated batch."""
        return self.model.attention and repeat_half(self.model.block_size) >= 2

    def tap_size(self, tap: str) -> int:
        """How many values one tap holds on the probe batch."""
        batch = max(1, min(PROBE_BATCH, self.data.n_val - self.model.block_size))
        width = self.model.d_ff if tap == "ffn_hidden" else self.model.d_model
        return batch * self.model.block_size * width

    def tap_counts(self, layer: int, tap: str) -> np.ndarray:
        """(probe steps, HIST_BINS + 2): counts below the range, in each bin, above it."""
        steps = len(self.timeline.probes)
        return self.rng("hist", layer, tap).multinomial(self.tap_size(tap), _HIST_P, steps)

    def write_histograms(self, store: RunStore, run_id: int) -> None:
        """One histogram per probe step, layer and tap, of the values inside HIST_RANGE."""
        lo, hi = HIST_RANGE
        for layer in range(self.model.n_layer):
            for tap in block_tap_names(self.model):
                counts = self.tap_counts(layer, tap)[:, 1:-1]
                for step, row in zip(self.timeline.probes, counts.tolist(), strict=True):
                    store.log_histogram(run_id, step, layer, tap, lo, hi, row)

    def write_samples_and_attention(self, store: RunStore, run_id: int) -> None:
        """A text sample and every head's attention map at each sample step."""
        data = self.data
        chars = np.array(data.vocab.chars)
        text_rng = self.rng("samples")
        for step in self.timeline.samples:
            text = "".join(text_rng.choice(chars, SAMPLE_CHARS).tolist())
            store.log_sample(run_id, step, data.prompt, text)
        if not self.model.attention or not self.timeline.samples:
            return
        size = min(ATTENTION_CHARS, self.model.block_size)
        tokens = list(data.text[data.n_train : data.n_train + size])  # probe sequence 0
        causal = np.tril(np.ones((size, size), dtype=bool))  # (T, T)
        for layer in range(self.model.n_layer):
            for head in range(self.model.n_head):
                rng = self.rng("attention", layer, head)
                scores = rng.standard_normal((len(self.timeline.samples), size, size))
                scores = np.where(causal, scores, -np.inf)  # (K, T, T)
                weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
                weights /= weights.sum(axis=-1, keepdims=True)  # each row sums to 1
                for step, one_map in zip(self.timeline.samples, weights, strict=True):
                    store.log_attention(run_id, step, layer, head, tokens, one_map.tolist())


# --------------------------------------------------------------------------- runs


def fake_config(**fields: Any) -> cfg.RunConfig:
    """A validated RunConfig on CORPUS (its vocab_size and name), with `fields` set."""
    vocab_size = CharVocab.from_text(CORPUS).size
    return cfg.replace(
        cfg.RunConfig(), vocab_size=vocab_size, dataset=CORPUS_NAME, **fields
    ).validate()


def _own_start() -> float | None:
    me = procs.identity_of()
    return None if me is None else me.started


def add_run(
    store: RunStore,
    config: cfg.RunConfig,
    status: str = "completed",
    *,
    step: int | None = None,
    name: str | None = None,
    created: float | None = None,
    seed: int = 0,
    index: int = 0,
) -> int:
    """Write one fake run with `config` that has reached `status` at `step`; its id.

    `step` defaults to the status's share of max_steps (PROGRESS); a diverged run's `step`
    is the step whose loss went non-finite. Running and queued runs name this process as
    theirs, so they look alive until it ends.
    """
    train = config.train
    if step is None:
        share = PROGRESS.get(status, 1.0)
        step = train.max_steps if status == "completed" else math.ceil(train.max_steps * share)
        if status == "diverged":
            step = min(max(step, 1), train.max_steps - 1)
    windows = train.eval_iters * train.batch_size
    data = fake_data(config.data.val_fraction, config.model.block_size, windows)
    created = time.time() if created is None else created
    run_id = store.create_run(
        name or f"fake-{index}",
        config.to_json(),
        status=status,
        created=created,
        dataset=data.fingerprint,
        pid=os.getpid(),
        pid_started=_own_start(),
    )
    if status == "queued":
        store.update_run(run_id, heartbeat=time.time(), step=0)
        return run_id
    line = timeline(train, status, step)
    fake = _FakeRun(config, line, seed, index)
    layer_rows, global_grad = fake.norm_rows()
    scalars = fake.scalar_rows(global_grad)
    store.log_scalars(run_id, scalars)
    store.log_layer_stats(run_id, layer_rows + fake.tap_and_head_rows())
    fake.write_histograms(store, run_id)
    fake.write_samples_and_attention(store, run_id)
    started = created + 2.0
    update: dict[str, Any] = {
        "started": started,
        "device": DEVICE,
        "precision": PRECISION,
        "n_params": params.param_breakdown(config.model).total,
        "step": step,
    }
    elapsed = 0.05 * max(1, step)
    if status == "running":
        update["heartbeat"] = time.time()
    else:
        update.update(ended=started + elapsed, heartbeat=started + elapsed)
    if status == "failed":
        update["error"] = FAILED_ERROR.format(step=step)
    if status in ("completed", "diverged", "stopped"):
        update["final"] = _final(scalars, step, elapsed)
    if status == "diverged":
        update["diverged_step"] = step
    store.update_run(run_id, **update)
    if status == "failed":
        store.flush()
        store.settle_step(run_id)
    return run_id


def _final(scalars: list[tuple[int, str, float]], step: int, elapsed: float) -> dict[str, Any]:
    """The final metrics a run records when it ends on its own (final_metrics.final_metrics)."""
    losses = [v for _, name, v in scalars if name == TRAIN_LOSS and math.isfinite(v)]
    last_val = {name: v for _, name, v in sorted(scalars) if name.startswith("val/")}
    rates = [v for _, name, v in scalars if name == TRAIN_TOKENS_PER_SEC]
    return {
        "train_loss": float(np.mean(losses[-50:])) if losses else None,
        "val_loss": last_val.get(VAL_LOSS),
        "val_ppl": last_val.get(VAL_PPL),
        "val_bpc": last_val.get(VAL_BPC),
        "answer_acc": None,  # only the ops dataset has answers to check
        "answer_baseline": None,
        "time_s": round(elapsed, 3),
        "tokens_per_sec": float(np.mean(rates)) if rates else None,
        "steps": step,
    }


def populate(
    store: RunStore,
    n_runs: int = 4,
    n_steps: int = 500,
    n_layer: int = 4,
    statuses: Sequence[str] = DEFAULT_STATUSES,
    probe_every: int = 50,
    seed: int = 0,
    *,
    n_head: int = 4,
    d_model: int = 128,
) -> list[int]:
    """Write n_runs fake runs (statuses cycled, Pre-/Post-LN alternating); their ids."""
    if n_runs < 0 or n_steps < 1 or n_layer < 1 or probe_every < 1 or not statuses:
        raise ValueError(
            f"populate: n_runs={n_runs}, n_steps={n_steps}, n_layer={n_layer}, "
            f"probe_every={probe_every} must be positive and statuses non-empty"
        )
    now = time.time()
    ids = []
    with store.bulk_load():
        for index in range(n_runs):
            config = fake_config(
                n_layer=n_layer,
                n_head=n_head,
                d_model=d_model,
                norm_position=("pre", "post")[index % 2],
                lr=(1e-3, 3e-3, 6e-4)[index % 3],
                max_steps=n_steps,
                warmup_steps=min(100, n_steps // 10),
                probe_interval=probe_every,
                eval_interval=max(1, min(100, n_steps // 5)),
                sample_interval=max(1, min(500, n_steps // 3)),
            )
            status = statuses[index % len(statuses)]
            created = now - (n_runs - index) * 600.0
            ids.append(add_run(store, config, status, created=created, seed=seed, index=index))
    return ids
