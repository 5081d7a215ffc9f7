"""Plausible fake runs written straight into a RunStore, for tests, demos and benchmarks.

Nothing here trains: losses decay with noise, a diverged run blows up to inf, gradient
norms differ between Pre-LN and Post-LN the way Xiong et al. (2020) describe, update ratios
sit near 1e-3. The values are deterministic given the seed (timestamps are relative to
now, so a 'running' run looks alive). No torch import: the UI tests use this.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np

from blockviz.core import config as cfg
from blockviz.core import procs
from blockviz.core.spec import TAP_STATS, TAPS
from blockviz.store import RunStore

DEFAULT_STATUSES = ("completed", "running", "diverged", "failed")
PROBE_TEXT = "To be, or not to be"
SAMPLE_PROMPT = "\n"
HISTOGRAM_TAPS = ("resid_post", "ffn_hidden")
HISTOGRAM_BINS = 32
HISTOGRAM_RANGE = (-4.0, 4.0)
PARAM_TENSORS = ("attn.qkv.weight", "attn.proj.weight", "ffn.fc.weight", "ffn.proj.weight")

# How far each status gets through max_steps before it stops.
_PROGRESS = {
    "completed": 1.0,
    "stopped": 0.7,
    "running": 0.6,
    "diverged": 0.4,
    "failed": 0.3,
    "queued": 0.0,
}

# Typical size of each activation statistic at each tap (before depth growth and noise).
_TAP_BASE = {
    "mean": 0.02,
    "std": 1.0,
    "rms": 1.0,
    "max_abs": 4.0,
    "zero_frac": 0.0,
}
_TAP_SCALE = {
    "resid_pre": 1.0,
    "norm1_out": 1.0,
    "attn_out": 0.4,
    "resid_mid": 1.1,
    "norm2_out": 1.0,
    "ffn_hidden": 0.6,
    "ffn_out": 0.5,
    "resid_post": 1.2,
}


def _own_start() -> float | None:
    """This process's start time, recorded with its pid so demo runs look alive."""
    me = procs.identity_of()
    return None if me is None else me.started


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
    param_stats: bool = True,
) -> list[int]:
    """Write n_runs fake runs (statuses cycled) into the store; their ids in order."""
    if n_runs < 0 or n_steps < 1 or n_layer < 1 or probe_every < 1 or not statuses:
        raise ValueError(
            f"populate: n_runs={n_runs}, n_steps={n_steps}, n_layer={n_layer}, "
            f"probe_every={probe_every} must be positive and statuses non-empty"
        )
    rng = np.random.default_rng(seed)
    now = time.time()
    ids = []
    with store.bulk_load():
        for index in range(n_runs):
            run = _SyntheticRun(
                index=index,
                status=statuses[index % len(statuses)],
                n_steps=n_steps,
                n_layer=n_layer,
                n_head=n_head,
                d_model=d_model,
                probe_every=probe_every,
                rng=rng,
            )
            created = now - (n_runs - index) * 600.0
            ids.append(run.write(store, now=created, param_stats=param_stats))
    return ids


class _SyntheticRun:
    """One fake run: its config, its curves and its probe statistics."""

    def __init__(
        self,
        *,
        index: int,
        status: str,
        n_steps: int,
        n_layer: int,
        n_head: int,
        d_model: int,
        probe_every: int,
        rng: np.random.Generator,
    ) -> None:
        self.index = index
        self.status = status
        self.rng = rng
        self.norm_position = ("pre", "post")[index % 2]
        eval_every = max(1, min(100, n_steps // 5))
        self.config = cfg.replace(
            cfg.RunConfig(),
            n_layer=n_layer,
            n_head=n_head,
            d_model=d_model,
            norm_position=self.norm_position,
            max_steps=n_steps,
            warmup_steps=min(100, n_steps // 10),
            probe_interval=probe_every,
            eval_interval=eval_every,
            sample_interval=max(1, min(200, n_steps // 3)),
            lr=(1e-3, 3e-3, 6e-4)[index % 3],
        ).validate()
        self.n_steps = n_steps
        self.n_layer = n_layer
        self.n_head = n_head
        self.last_step = max(0, math.ceil(n_steps * _PROGRESS.get(status, 1.0)) - 1)
        self.diverged_step = self.last_step if status == "diverged" else None

    # -- run row -----------------------------------------------------------------------

    def write(self, store: RunStore, *, now: float, param_stats: bool) -> int:
        """Create the run row and log every table; the run's id."""
        model, train = self.config.model, self.config.train
        fields: dict[str, Any] = {
            "created": now,
            "device": "cpu",
            "precision": "32-true",
            "n_params": _rough_param_count(model.n_layer, model.d_model, model.vocab_size),
            "dataset": {"name": self.config.data.dataset, "vocab_size": model.vocab_size},
        }
        name = f"synthetic-{self.norm_position}ln-{self.index}"
        run_id = store.create_run(name, self.config.to_json(), status=self.status, **fields)
        if self.status == "queued":
            # A queued run waits in a live process, or reap_dead would fail it.
            store.update_run(
                run_id, pid=os.getpid(), pid_started=_own_start(), heartbeat=time.time()
            )
            return run_id
        scalars = self.scalar_rows()
        store.log_scalars(run_id, scalars)
        store.log_layer_stats(run_id, self.layer_rows(param_stats=param_stats))
        self.write_histograms(store, run_id)
        self.write_samples_and_attention(store, run_id)
        started = now + 5.0
        duration = (self.last_step + 1) * 0.05
        update: dict[str, Any] = {"started": started, "step": self.last_step}
        if self.status == "running":
            update.update(pid=os.getpid(), pid_started=_own_start(), heartbeat=time.time())
        else:
            update.update(ended=started + duration, heartbeat=started + duration)
        if self.status == "completed":
            update["step"] = train.max_steps
        if self.status == "diverged":
            update["diverged_step"] = self.diverged_step
        if self.status == "failed":
            update["error"] = (
                f"RuntimeError: out of memory at step {self.last_step} (synthetic failure)"
            )
        if self.status in ("completed", "diverged", "stopped"):
            last = {name: value for _, name, value in scalars if name.startswith("train/")}
            update["final"] = {"train_loss": last["train/loss"], "steps": update["step"]}
        store.update_run(run_id, **update)
        return run_id

    # -- curves ------------------------------------------------------------------------

    def scalar_rows(self) -> list[tuple[int, str, float]]:
        """Train curves every step, validation every eval_interval."""
        train = self.config.train
        steps = np.arange(self.last_step + 1)
        noise = self.rng.standard_normal((4, steps.size))
        floor = 1.45 + 0.08 * (self.norm_position == "post") + 0.03 * (self.index % 3)
        tau = 0.12 * self.n_steps + 5
        loss = floor + (4.17 - floor) * np.exp(-steps / tau)  # ln(65): uniform over chars
        loss = loss * (1 + 0.02 * noise[0])
        grad_norm = (0.4 + 2.0 * np.exp(-steps / (0.05 * self.n_steps + 1))) * np.exp(
            0.15 * noise[1]
        )
        if self.diverged_step is not None:
            ramp = max(3, self.diverged_step // 10)
            start = self.diverged_step - ramp
            blow = np.clip((steps - start) / ramp, 0, None)
            loss = loss * np.exp(4 * blow**2)
            grad_norm = grad_norm * np.exp(6 * blow**2)
            loss[-1] = math.inf  # the step that diverged
            grad_norm[-1] = math.nan
        warmup = max(1, train.warmup_steps)
        progress = np.clip((steps - warmup) / max(1, train.max_steps - warmup), 0, 1)
        cosine = train.min_lr + 0.5 * (train.lr - train.min_lr) * (1 + np.cos(math.pi * progress))
        lr = np.where(steps < warmup, train.lr * (steps + 1) / warmup, cosine)
        step_time = 0.05 * np.exp(0.1 * noise[2])
        tokens = train.batch_size * self.config.model.block_size
        rows: list[tuple[int, str, float]] = []
        step_list = steps.tolist()
        for name, values in (
            ("train/loss", loss),
            ("train/lr", lr),
            ("train/step_time", step_time),
            ("train/tokens_per_sec", tokens / step_time),
            ("train/grad_norm", grad_norm),
        ):
            rows.extend(zip(step_list, repeat(name), values.tolist(), strict=False))
        val_steps = [s for s in step_list if s % train.eval_interval == 0 or s == step_list[-1]]
        for step in val_steps:
            val_loss = float(loss[step]) + 0.05 + 0.01 * float(noise[3][step])
            if self.diverged_step is not None and step >= self.diverged_step:
                val_loss = math.nan
            rows += [
                (step, "val/loss", val_loss),
                (step, "val/bpc", val_loss / math.log(2)),
                (step, "val/ppl", math.exp(min(val_loss, 700.0))),
            ]
        return rows

    # -- probes ------------------------------------------------------------------------

    def probe_steps(self) -> list[int]:
        """Step 0 (the gradient at initialisation), every probe_interval, and the last."""
        every = self.config.train.probe_interval
        return list(range(0, self.last_step + 1, every))

    def layer_rows(self, *, param_stats: bool) -> list[tuple[int, int, str, str, str, float]]:
        """Component, parameter, tap and head statistics at every probe step."""
        steps = np.asarray(self.probe_steps())
        rows: list[tuple[int, int, str, str, str, float]] = []
        decay = np.exp(-steps / (0.2 * self.n_steps + 1))  # (S,)
        blow = np.ones_like(decay)
        if self.diverged_step is not None:
            span = max(1, self.diverged_step // 5)
            blow = np.exp(3 * np.clip((steps - self.diverged_step + span) / span, 0, None))
        n_layer = self.n_layer

        # Components: embeddings at -1, blocks 0..n_layer-1, final norm + head at n_layer.
        layer_parts = [(-1, "embed")]
        for layer in range(n_layer):
            layer_parts += [(layer, part) for part in ("attn", "ffn", "norm", "block")]
        layer_parts.append((n_layer, "head"))
        if self.config.model.use_final_norm:
            layer_parts.append((n_layer, "norm"))
        for layer, part in layer_parts:
            depth = (layer + 1) / (n_layer + 1)
            if self.norm_position == "post":
                at_init = 0.05 * 6.0**depth  # Post-LN: largest near the output at init
            else:
                at_init = 0.3 * (1.2 - 0.4 * depth)  # Pre-LN: flat, slightly larger early
            grad = at_init * (0.4 + 0.6 * decay) * blow
            param = 8.0 * (1 + 0.1 * layer) * (1 + 0.05 * (1 - decay))
            ratio = 1e-3 * (0.7 + 0.6 * decay) * blow
            rows += self._series(steps, layer, "component", part, "grad_norm", grad)
            rows += self._series(steps, layer, "component", part, "param_norm", param)
            # No update has happened at step 0, so no ratio there.
            rows += self._series(steps[1:], layer, "component", part, "update_ratio", ratio[1:])
            if param_stats and 0 <= layer < n_layer and part in ("attn", "ffn"):
                for tensor in PARAM_TENSORS:
                    if tensor.startswith(part):
                        full = f"blocks.{layer}.{tensor}"
                        rows += self._series(steps, layer, "param", full, "grad_norm", grad / 2)
                        rows += self._series(steps, layer, "param", full, "param_norm", param / 2)
                        rows += self._series(
                            steps[1:], layer, "param", full, "update_ratio", ratio[1:]
                        )

        relu_like = self.config.model.activation == "relu"
        for layer in range(n_layer):
            growth = 1 + (0.25 * layer if self.norm_position == "pre" else 0.0)
            for tap in TAPS:
                scale = _TAP_SCALE[tap] * (growth if tap.startswith("resid") else 1.0)
                for stat in TAP_STATS:
                    base = _TAP_BASE[stat] * scale * (1 + 0.3 * (1 - decay)) * blow
                    if stat == "zero_frac":
                        base = np.full_like(decay, 0.5 if relu_like and tap == "ffn_hidden" else 0)
                    rows += self._series(steps, layer, "tap", tap, stat, base)
            for head in range(self.n_head):
                entropy = math.log(8) * (0.5 + 0.5 * decay) * (1 + 0.1 * head)
                rows += self._series(steps, layer, "head", str(head), "attn_entropy", entropy)
        return rows

    def _series(
        self, steps: np.ndarray, layer: int, kind: str, component: str, stat: str, values: Any
    ) -> list[tuple[int, int, str, str, str, float]]:
        """Rows of one statistic over the probe steps, with a little multiplicative noise."""
        values = np.broadcast_to(np.asarray(values, dtype=float), steps.shape)
        noisy = values * np.exp(0.05 * self.rng.standard_normal(steps.shape))
        return list(
            zip(
                steps.tolist(),
                repeat(layer),
                repeat(kind),
                repeat(component),
                repeat(stat),
                noisy.tolist(),
                strict=False,
            )
        )

    def write_histograms(self, store: RunStore, run_id: int) -> None:
        """Histograms of two taps per layer at every fourth probe step and the last."""
        steps = self.probe_steps()
        chosen = sorted(set(steps[::4]) | {steps[-1]})
        draws = self.rng.standard_normal(2000)
        lo, hi = HISTOGRAM_RANGE
        for step in chosen:
            spread = 1 + 0.5 * step / self.n_steps
            for layer in range(self.n_layer):
                for tap in HISTOGRAM_TAPS:
                    values = draws * spread * (1 + 0.1 * layer)
                    if tap == "ffn_hidden":
                        values = np.maximum(values, -0.2)
                    counts, _ = np.histogram(
                        np.clip(values, lo, hi), bins=HISTOGRAM_BINS, range=(lo, hi)
                    )
                    store.log_histogram(run_id, step, layer, tap, lo, hi, counts.tolist())

    def write_samples_and_attention(self, store: RunStore, run_id: int) -> None:
        """Three generated samples, and attention maps at the last two sample steps."""
        every = self.config.train.sample_interval
        sample_steps = sorted({*range(0, self.last_step + 1, every), self.last_step})
        alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz   ,.\nTOBE"))
        for step in sample_steps[-3:]:
            quality = step / max(1, self.n_steps)
            words = "To be, or not to be, that is the question:\n" * 2
            noise = self.rng.choice(alphabet, size=len(words))
            keep = self.rng.random(len(words)) < quality
            text = "".join(w if k else n for w, k, n in zip(words, keep, noise, strict=True))
            store.log_sample(run_id, step, SAMPLE_PROMPT, text)
        tokens = list(PROBE_TEXT)
        size = len(tokens)
        causal = np.tril(np.ones((size, size), dtype=bool))  # (T, T)
        for step in sample_steps[-2:]:
            for layer in range(self.n_layer):
                for head in range(self.n_head):
                    scores = self.rng.standard_normal((size, size)) * (1 + head)  # (T, T)
                    scores = np.where(causal, scores, -np.inf)
                    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
                    weights /= weights.sum(axis=1, keepdims=True)  # rows sum to 1
                    store.log_attention(run_id, step, layer, head, tokens, weights.tolist())


def _rough_param_count(n_layer: int, d_model: int, vocab_size: int) -> int:
    """About the parameter count of a GPT-style model (a synthetic run needs no exact one)."""
    per_block = 12 * d_model * d_model + 13 * d_model
    return n_layer * per_block + 2 * vocab_size * d_model + 2 * d_model
