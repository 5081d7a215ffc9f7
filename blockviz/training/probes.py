"""BlockProbe: a Lightning Callback that records what each block is doing.

At step 0 (the gradient at initialization), every `probe_interval` steps and at the last
trained step (max_steps - 1: the last batch with a gradient): gradient, parameter and
update norms per tensor, component and layer (gradients read in `on_before_optimizer_step`,
after the backward pass and AMP unscaling, before clipping; the update compared in
`on_train_batch_end`), activation statistics and histograms at every tap of every block,
attention and logit statistics, and the induction statistics (`training.induction`), on
fixed probe batches. Every `sample_interval` steps (and when training ends): the attention
maps of one fixed probe sequence and a text sample. docs/internals.md ("What a run does")
lists every statistic and where the store keeps it.

Everything a probe step measures is computed on the device, each statistic under its
name in core.spec's registry (`blockviz.training.probe_stats`), for every run the module
trains at once: K replicas' statistics come from tensor work over their stacked (K, ...)
parameters and one stacked probe forward (a solo run is a stack of one), so a probe
step's device and host calls do not grow with K. The values reach the host in one
transfer, become one `ProbeRecords` per run and go to its sinks (`blockviz.training.sinks`:
the run store, Lightning loggers). Forward hooks exist only inside `tap_hooks`, for one
probe forward pass, so ordinary steps run the bare model. Only global rank 0 probes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from blockviz.core.induction import probe_tokens
from blockviz.core.probe_schedule import is_probe_step
from blockviz.core.spec import (
    GRAD_NORM,
    HIST_BINS,
    HIST_RANGE,
    PARAM_NORM,
    PROBE_SCALARS,
)
from blockviz.training.induction import (
    PREFIX_PART,
    add_copying,
    induction_parts,
    induction_records,
    repeated_batch,
)
from blockviz.training.model import capture_attention
from blockviz.training.probe_stats import (
    TAP_GROUPS,
    ParamIndex,
    RunStack,
    attention_entropy,
    attention_maps,
    group_rows,
    head_rows,
    head_statistics,
    norm_rows,
    output_statistics,
    row_norms,
    tap_records,
    tap_statistics,
)
from blockviz.training.sinks import ProbeRecords, ProbeSink, Sample


@contextmanager
def tap_hooks(
    model: nn.Module,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    taps: Collection[str] | None = None,
) -> Iterator[dict[tuple[int, str], torch.Tensor]]:
    """Forward hooks on every tap of every block of a CharTransformer (or only the `taps`
    named), removed on exit whatever happens.

    Yields {(layer, tap): reduce(activation)} filled by forward passes run inside the
    block; without `reduce` the detached activation itself is kept.
    """
    results: dict[tuple[int, str], torch.Tensor] = {}
    handles = []

    def recorder(key: tuple[int, str]) -> Callable[[nn.Module, Any, torch.Tensor], None]:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            value = output.detach()
            results[key] = reduce(value) if reduce is not None else value

        return hook

    try:
        for layer, block in enumerate(model.blocks):
            for tap_name, tap in block.taps.items():
                if taps is not None and tap_name not in taps:
                    continue
                handles.append(tap.register_forward_hook(recorder((layer, tap_name))))
        yield results
    finally:
        for handle in handles:
            handle.remove()


def to_host(pending: _PendingProbe, k: int) -> list[dict[str, list[float]]]:
    """Every statistic of a pending probe step of `k` runs (each part (K, ...)) on the host,
    in one device->host copy; one {name: values} per run."""
    names = list(pending.parts)
    rows = [pending.parts[name].reshape(k, -1).float() for name in names]  # (K, n_i) each
    values = torch.cat(rows, dim=1).tolist() if rows else [[] for _ in range(k)]  # (K, n)
    ends = list(itertools.accumulate(row.size(1) for row in rows))
    spans = list(zip(names, [0, *ends][: len(ends)], ends, strict=True))
    return [{name: run[start:end] for name, start, end in spans} for run in values]


@dataclass
class _PendingProbe:
    """Device tensors of one probe step of every run, (K, ...) each, waiting for the
    post-step half."""

    step: int
    runs: list[int]  # the runs whose records are written (with sinks, still live)
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    before: list[torch.Tensor] | None = None  # parameter snapshot, for the update ratio
    # (layer, tap) of each row of parts["taps"], ["stream"] and ["units"]
    tap_keys: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    attention_layers: list[int] = field(default_factory=list)
    attention_tokens: list[str] | None = None
    samples: list[str | None] = field(default_factory=list)  # each run's text sample


class BlockProbe(Callback):
    """Gradient, parameter, update, activation and attention statistics of each run the
    module trains, to its sinks.

    `run_sinks` gives each run's sinks (one list for a solo run, K for `LitReplicas`; a
    run without sinks, or a rank other than 0, measures nothing). Every run is measured at
    once, on the module's `stack()`, as the module docstring says. `prompt` seeds the text
    samples; `induction` False leaves the induction statistics out (for measuring their cost).
    """

    probe_batch = 4  # sequences of the validation split in the fixed probe batch
    attention_chars = 48  # the attention map shows the first characters of sequence 0
    temperature, top_k = 0.8, None  # how the text samples are drawn

    def __init__(
        self,
        run_sinks: Sequence[Sequence[ProbeSink]],
        probe_interval: int = 50,
        sample_interval: int = 200,
        prompt: str = "\n",
        sample_chars: int = 120,
        induction: bool = True,
    ) -> None:
        self.run_sinks = [list(run) for run in run_sinks]
        self.probe_interval = probe_interval
        self.sample_interval = sample_interval
        self.prompt = prompt
        self.sample_chars = sample_chars
        self.induction = induction
        self._index: ParamIndex | None = None  # the parameters' groups, once the fit starts
        self._n_layer = 0
        self._probe_x: torch.Tensor | None = None
        self._repeat_x: torch.Tensor | None = None  # the induction statistics' batch
        self._pending: _PendingProbe | None = None  # this step's, measured
        self._last_sample_step: int | None = None
        self._last_step: int | None = None  # the fit's last trained step, max_steps - 1
        self.probe_steps: list[int] = []  # gradient-probe steps run in this process

    # -- setup ----------------------------------------------------------------------------

    def _runs(self, pl_module: L.LightningModule) -> list[int]:
        """The runs whose records are written: those with sinks, still live."""
        live = pl_module.live
        return [i for i, sinks in enumerate(self.run_sinks) if sinks and live[i]]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Index the parameters into groups and draw the fixed probe batch once."""
        if not any(self.run_sinks) or not trainer.is_global_zero:
            return
        # Batch max_steps - 1 is the last one whose gradient and update exist; a fit bounded
        # by epochs instead (max_steps -1) has no known last step.
        self._last_step = trainer.max_steps - 1 if trainer.max_steps > 0 else None
        stack = pl_module.stack()
        config, device = stack.model.cfg, stack.params[0].device
        self._n_layer = config.n_layer
        self._index = ParamIndex.of(stack.names, stack.params, config.n_layer)
        self._probe_x = self._draw_probe_batch(trainer, config.block_size).to(device)
        vocab = getattr(pl_module, "vocab", None) or getattr(trainer.datamodule, "vocab", None)
        pool = probe_tokens(vocab.chars) if vocab is not None else range(config.vocab_size)
        repeats = repeated_batch(pool, config.block_size)
        if self.induction and config.attention and repeats is not None:
            self._repeat_x = repeats.to(device)

    def _draw_probe_batch(self, trainer: L.Trainer, block_size: int) -> torch.Tensor:
        """`probe_batch` evenly spaced windows of the validation split: (B, T), no RNG."""
        datamodule = trainer.datamodule
        val_ids = datamodule.val_ids  # (N_val,)
        span = len(val_ids) - block_size
        count = max(1, min(self.probe_batch, span))
        starts = torch.linspace(0, span - 1, count).long()  # (B,)
        offsets = torch.arange(block_size)  # (T,)
        return val_ids[starts[:, None] + offsets]  # (B, T)

    def is_probe_step(self, step: int) -> bool:
        """Whether `step` gets gradient / activation statistics: every interval and the last."""
        return is_probe_step(step, self.probe_interval, self._last_step)

    def sampled_at(self, step: int) -> bool:
        """Whether the latest text sample is of `step` (the end then needs no other)."""
        return self._last_sample_step == step

    # -- before the optimizer step: gradients, parameters, activations ---------------------

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """At probe and sample steps, measure every run's model as it is before update
        `step`, all K at once."""
        if self._index is None:
            return
        step = trainer.global_step
        probe, sample = self.is_probe_step(step), step % self.sample_interval == 0
        runs = self._runs(pl_module)
        if not (probe or sample) or not runs:
            return
        stack = pl_module.stack()
        pending = self._pending = _PendingProbe(step=step, runs=runs)
        if probe:
            self._measure_gradients(stack, pending)
        self._measure_forward(trainer, pl_module, stack, pending, probe=probe, sample=sample)
        if sample:
            pending.samples = self._generate(pl_module, step)

    @torch.no_grad()
    def _measure_gradients(self, stack: RunStack, pending: _PendingProbe) -> None:
        pairs = zip(stack.params, stack.grads, strict=True)
        grads = [g if g is not None else torch.zeros_like(p) for p, g in pairs]
        grad_norm = row_norms(grads)  # (K, P)
        pending.parts[GRAD_NORM] = grad_norm
        pending.parts[PARAM_NORM] = row_norms(stack.params)  # (K, P)
        pending.parts["global_grad_norm"] = grad_norm.square().sum(dim=1).sqrt()  # (K,)
        pending.before = [p.clone() for p in stack.params]

    @torch.no_grad()
    def _measure_forward(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        stack: RunStack,
        pending: _PendingProbe,
        *,
        probe: bool,
        sample: bool,
    ) -> None:
        """One stacked forward pass of the probe batch, every run at once, with taps hooked
        and attention captured."""
        model = stack.model
        was_training = model.training
        model.eval()  # no dropout: statistics comparable across steps

        # Every tap's TAP_STATS ("taps"), and each TapGroup's at its tap: {part: reduce, taps}
        hooked = {"taps": (tap_statistics, None)} | {
            g.part: (g.reduce, (g.tap,)) for g in TAP_GROUPS
        }
        # The probe sees the same numerics as training (autocast under mixed precision).
        precision_context = getattr(trainer.precision_plugin, "forward_context", nullcontext)
        found: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
        try:
            with ExitStack() as hooks:
                hooks.enter_context(precision_context())
                for part, (reducer, taps) in hooked.items() if probe else ():
                    found[part] = hooks.enter_context(tap_hooks(model, reducer, taps))
                attention = hooks.enter_context(capture_attention(model))
                logits = stack(self._probe_x)  # (K, B, T, V)
            if probe and self._repeat_x is not None:
                pending.parts.update(induction_parts(stack, self._repeat_x, precision_context))
        finally:
            model.train(was_training)
        if probe:
            pending.parts["output"] = output_statistics(logits)  # (K, len(PROBE_SCALARS))
        for part, stats in found.items():
            if stats:
                pending.tap_keys[part] = sorted(stats)  # (K, keys, stats) each
                pending.parts[part] = torch.stack([stats[k] for k in sorted(stats)], dim=1)
        layers = sorted(attention)
        if not layers:
            return  # attention is off in this model
        pending.attention_layers = layers
        if probe:
            pending.parts["heads"] = head_statistics(  # (K, len(ATTENTION_HEAD_STATS), L, nh)
                torch.stack([attention_entropy(attention[layer]) for layer in layers], dim=1),
                torch.stack([attention.max_logits[layer] for layer in layers], dim=1),
                torch.stack([attention.max_abs_logits[layer] for layer in layers], dim=1),
            )
        if sample:
            n = min(self.attention_chars, self._probe_x.size(1))
            # sequence 0's map of every run: L x (K, nh, n, n)
            maps = [attention[layer][:, 0, :, :n, :n].float() for layer in layers]
            pending.parts["attention"] = torch.stack(maps, dim=1)  # (K, L, nh, n, n)
            vocab = getattr(pl_module, "vocab", None) or trainer.datamodule.vocab
            pending.attention_tokens = list(vocab.decode(self._probe_x[0, :n].tolist()))

    def _generate(self, pl_module: L.LightningModule, step: int) -> list[str | None]:
        """Each run's text sample of `step`, in one pass (None for a run whose logits are
        not finite: a diverged model has nothing to say; the run says why)."""
        if getattr(pl_module, "vocab", None) is None:
            return [None] * len(self.run_sinks)
        self._last_sample_step = step
        return pl_module.generate_all(
            self.prompt,
            max_new_tokens=self.sample_chars,
            temperature=self.temperature,
            top_k=self.top_k,
            seed=step,
        )

    # -- after the optimizer step: update ratios, one transfer, the writes ----------------

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Finish a pending probe step: update ratios, then one transfer and the writes."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.before is not None:
            with torch.no_grad():
                deltas = torch._foreach_sub(pl_module.stack().params, pending.before)
                pending.parts["delta_norm"] = row_norms(deltas)  # (K, P)
            pending.before = None
            self.probe_steps.append(pending.step)
        self._write(pending, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A last attention map and text sample of each run's trained model."""
        if self._index is None:
            return
        step = trainer.global_step
        runs = self._runs(pl_module)
        if runs and not self.sampled_at(step):
            stack = pl_module.stack()
            pending = _PendingProbe(step=step, runs=runs)
            self._measure_forward(trainer, pl_module, stack, pending, probe=False, sample=True)
            pending.samples = self._generate(pl_module, step)
            self._write(pending, pl_module)
        for sinks in self.run_sinks:
            for sink in sinks:
                sink.flush()

    def _write(self, pending: _PendingProbe, pl_module: L.LightningModule) -> None:
        """Move every statistic of every run's pending step to the host in one transfer,
        then hand each run's records to its sinks."""
        hosts = to_host(pending, len(pl_module.live))
        add_copying([hosts[run] for run in pending.runs])
        for run in pending.runs:
            records = self._records_from_host(run, pending, hosts[run])
            for sink in self.run_sinks[run]:
                sink.write(records)

    def _records_from_host(
        self, run: int, pending: _PendingProbe, host: dict[str, list[float]]
    ) -> ProbeRecords:
        """The host-side records of run `run`'s probe step from its values on the host."""
        step = pending.step
        records = ProbeRecords(step=step, n_layer=self._n_layer)
        rows = records.layer_stats
        if GRAD_NORM in host:
            rows += norm_rows(step, self._index, host)
            records.grad_norm = host["global_grad_norm"][0]
        if "output" in host:
            records.scalars = dict(zip(PROBE_SCALARS, host["output"], strict=True))
        if "taps" in host:
            keys = pending.tap_keys["taps"]
            tap_rows, records.histograms = tap_records(
                step, keys, host["taps"], HIST_BINS, HIST_RANGE
            )
            rows += tap_rows
        for group in TAP_GROUPS:
            if group.part in host:
                rows += group_rows(step, group, pending.tap_keys[group.part], host[group.part])
        if "heads" in host:
            rows += head_rows(step, pending.attention_layers, host["heads"])
        if PREFIX_PART in host:
            induction_rows, induction_scalars = induction_records(
                step, pending.attention_layers, host
            )
            rows += induction_rows
            records.scalars.update(induction_scalars)
        if "attention" in host and pending.attention_tokens is not None:
            records.attention = attention_maps(
                pending.attention_layers, pending.attention_tokens, host["attention"]
            )
        if pending.samples and pending.samples[run] is not None:
            records.sample = Sample(self.prompt, pending.samples[run])
        return records
