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
name in core.spec's registry (`blockviz.training.probe_stats`), and reaches the host in one
transfer, becomes one `ProbeRecords` and goes to every sink (`blockviz.training.sinks`:
the run store, Lightning loggers). Forward hooks exist only inside `tap_hooks`, for one
probe forward pass, so ordinary steps run the bare model. Only global rank 0 probes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from blockviz.core.params import param_component
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
    induction_parts,
    induction_records,
    repeated_batch,
)
from blockviz.training.model import capture_attention
from blockviz.training.probe_stats import (
    TAP_GROUPS,
    ParamIndex,
    attention_entropy,
    attention_maps,
    group_rows,
    head_rows,
    head_statistics,
    norm_rows,
    output_statistics,
    tap_records,
    tap_statistics,
)
from blockviz.training.sinks import LayerStat, ProbeRecords, ProbeSink, Sample


def char_model(module: nn.Module) -> nn.Module:
    """The CharTransformer inside a LightningModule and/or a torch.compile wrapper."""
    model = getattr(module, "model", module)
    return getattr(model, "_orig_mod", model)


@contextmanager
def tap_hooks(
    model: nn.Module,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    taps: Collection[str] | None = None,
) -> Iterator[dict[tuple[int, str], torch.Tensor]]:
    """Forward hooks on every tap of every block (or only the `taps` named), removed on
    exit whatever happens.

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
        for layer, block in enumerate(char_model(model).blocks):
            for tap_name, tap in block.taps.items():
                if taps is not None and tap_name not in taps:
                    continue
                handles.append(tap.register_forward_hook(recorder((layer, tap_name))))
        yield results
    finally:
        for handle in handles:
            handle.remove()


def _run_modules(pl_module: L.LightningModule) -> list[nn.Module]:
    """Each run's own module (`OneStep.run_modules`; any other module is its one run's)."""
    run_modules = getattr(pl_module, "run_modules", None)
    return run_modules() if run_modules is not None else [pl_module]


def param_index(model: nn.Module) -> ParamIndex:
    """The model's trainable parameters, each with its group (layer, component), its layer
    and, for a weight matrix, its layer among those with matrices."""
    n_layer = model.cfg.n_layer
    names, params, keys = [], [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            clean = name.replace("_orig_mod.", "")  # torch.compile's prefix
            names.append(clean)
            params.append(param)
            keys.append(param_component(clean, n_layer))
    groups = sorted(set(keys))
    layers = sorted({layer for layer, _ in keys})
    is_matrix = [param.ndim == 2 for param in params]
    matrix_layers = sorted({layer for (layer, _), m in zip(keys, is_matrix, strict=True) if m})
    return ParamIndex(
        names=names,
        params=params,
        groups=groups,
        layers=layers,
        group_of=torch.tensor([groups.index(k) for k in keys]),
        layer_of=torch.tensor([layers.index(k[0]) for k in keys]),
        matrix_layers=matrix_layers,
        matrix_of=torch.tensor(
            [
                matrix_layers.index(layer) if m else -1
                for (layer, _), m in zip(keys, is_matrix, strict=True)
            ]
        ),
    )


def to_host(pendings: Sequence[_PendingProbe]) -> list[dict[str, list[float]]]:
    """Every statistic of the pending probe steps on the host, in one device->host copy
    (replicas of a batch send all of theirs together); one {name: values} per pending."""
    flat = [
        (index, name, tensor.reshape(-1).float())
        for index, pending in enumerate(pendings)
        for name, tensor in pending.parts.items()
    ]
    values = torch.cat([tensor for _, _, tensor in flat]).tolist() if flat else []
    hosts: list[dict[str, list[float]]] = [{} for _ in pendings]
    offset = 0
    for index, name, tensor in flat:
        hosts[index][name] = values[offset : offset + tensor.numel()]
        offset += tensor.numel()
    return hosts


@dataclass
class _PendingProbe:
    """Device tensors of one probe step, waiting for the post-step half."""

    step: int
    parts: dict[str, torch.Tensor] = field(default_factory=dict)
    before: list[torch.Tensor] | None = None  # parameter snapshot, for the update ratio
    tap_keys: list[tuple[int, str]] = field(default_factory=list)
    # (layer, tap) of each row of parts["stream"] and parts["units"]
    extra_keys: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    attention_layers: list[int] = field(default_factory=list)
    attention_tokens: list[str] | None = None
    sample: str | None = None


class BlockProbe(Callback):
    """Gradient, parameter, update, activation and attention statistics of each run the
    module trains, to its sinks.

    `sinks` take each probe step's records of the module's one run (none: measure nothing,
    e.g. on ranks other than 0); `run_sinks` instead gives each run's, for a module of
    several (`LitReplicas`: each replica is measured on its own module, `run_modules`, its
    text samples drawn in one pass, and every replica's probe step reaches the host in
    one transfer). `prompt` seeds the text samples; `probe_batch` sequences of the
    validation split form the fixed probe batch; the attention map shows the first
    `attention_chars` of sequence 0; `induction` False leaves the induction statistics
    out (for measuring what they cost).
    """

    def __init__(
        self,
        sinks: Sequence[ProbeSink] = (),
        probe_interval: int = 50,
        sample_interval: int = 200,
        probe_batch: int = 4,
        prompt: str = "\n",
        sample_chars: int = 120,
        attention_chars: int = 48,
        temperature: float = 0.8,
        top_k: int | None = None,
        hist_bins: int = HIST_BINS,
        hist_range: tuple[float, float] = HIST_RANGE,
        induction: bool = True,
        run_sinks: Sequence[Sequence[ProbeSink]] | None = None,
    ) -> None:
        self.run_sinks = [list(run) for run in run_sinks or [sinks]]
        self.probe_interval = probe_interval
        self.sample_interval = sample_interval
        self.probe_batch = probe_batch
        self.prompt = prompt
        self.sample_chars = sample_chars
        self.attention_chars = attention_chars
        self.temperature = temperature
        self.top_k = top_k
        self.hist_bins = hist_bins
        self.hist_range = hist_range
        self.induction = induction
        self._indexes: list[ParamIndex] = []  # each run's parameters, once the fit starts
        self._n_layer = 0
        self._probe_x: torch.Tensor | None = None
        self._repeat_x: torch.Tensor | None = None  # the induction statistics' batch
        self._pending: dict[int, _PendingProbe] = {}  # by run: this step's, measured
        self._last_sample_step: int | None = None
        self._last_step: int | None = None  # the fit's last trained step, max_steps - 1
        self.probe_steps: list[int] = []  # gradient-probe steps run in this process

    # -- setup ----------------------------------------------------------------------------

    @property
    def sinks(self) -> list[ProbeSink]:
        """The first run's sinks (a solo run's)."""
        return self.run_sinks[0]

    def _active(self, trainer: L.Trainer) -> bool:
        return any(self.run_sinks) and trainer.is_global_zero

    def _runs(self, pl_module: L.LightningModule) -> list[tuple[int, nn.Module]]:
        """(index, module) of each run this probe measures: one with sinks, still live."""
        modules = _run_modules(pl_module)
        live = getattr(pl_module, "live", [True] * len(modules))
        return [(i, m) for i, m in enumerate(modules) if self.run_sinks[i] and live[i]]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Index each run's parameters into groups and draw the fixed probe batch once."""
        if not self._active(trainer):
            return
        # Batch max_steps - 1 is the last one whose gradient and update exist; a fit bounded
        # by epochs instead (max_steps -1) has no known last step.
        self._last_step = trainer.max_steps - 1 if trainer.max_steps > 0 else None
        models = [char_model(module) for module in _run_modules(pl_module)]
        self._indexes = [param_index(model) for model in models]
        config, device = models[0].cfg, self._indexes[0].params[0].device
        self._n_layer = config.n_layer
        self._probe_x = self._draw_probe_batch(trainer, config.block_size).to(device)
        repeats = repeated_batch(config.vocab_size, config.block_size)
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

    def is_sample_step(self, step: int) -> bool:
        """Whether `step` gets attention maps and a text sample."""
        return step % self.sample_interval == 0

    def sampled_at(self, step: int) -> bool:
        """Whether the latest text sample is of `step` (the end then needs no other)."""
        return self._last_sample_step == step

    # -- before the optimizer step: gradients, parameters, activations ---------------------

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """At probe and sample steps, measure each run's model as it is before update
        `step` (a module of several shares each run's gradients with its own module)."""
        if not self._indexes:
            return
        step = trainer.global_step
        probe, sample = self.is_probe_step(step), self.is_sample_step(step)
        if not (probe or sample):
            return
        share_grads = getattr(pl_module, "share_grads", None)
        for index, module in self._runs(pl_module):
            pending = self._pending[index] = _PendingProbe(step=step)
            if probe:
                if share_grads is not None:
                    share_grads(index)
                self._measure_gradients(self._indexes[index], pending)
            self._measure_forward(trainer, module, pending, probe=probe, sample=sample)
        if sample:
            texts = self._generate(pl_module, step)
            for index, pending in self._pending.items():
                pending.sample = texts[index]

    @torch.no_grad()
    def _measure_gradients(self, index: ParamIndex, pending: _PendingProbe) -> None:
        params = index.params
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        # One fused kernel per list instead of one norm per tensor (what clip_grad_norm_ uses).
        grad_norm = torch.stack(torch._foreach_norm(grads)).float()  # (P,)
        param_norm = torch.stack(torch._foreach_norm(params)).float()  # (P,)
        pending.parts[GRAD_NORM] = grad_norm
        pending.parts[PARAM_NORM] = param_norm
        pending.parts["global_grad_norm"] = grad_norm.square().sum().sqrt().reshape(1)  # (1,)
        pending.before = [p.detach().clone() for p in params]

    @torch.no_grad()
    def _measure_forward(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        pending: _PendingProbe,
        *,
        probe: bool,
        sample: bool,
    ) -> None:
        """One forward pass of the probe batch with taps hooked and attention captured."""
        model = char_model(pl_module)
        was_training = model.training
        model.eval()  # no dropout: statistics comparable across steps

        def reduce(activation: torch.Tensor) -> torch.Tensor:
            return tap_statistics(activation, self.hist_bins, self.hist_range)

        # The probe sees the same numerics as training (autocast under mixed precision).
        precision_context = getattr(trainer.precision_plugin, "forward_context", nullcontext)
        extras: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
        try:
            with ExitStack() as stack:
                stack.enter_context(precision_context())
                tap_stats = stack.enter_context(tap_hooks(model, reduce)) if probe else {}
                if probe:
                    for group in TAP_GROUPS:
                        hooks = tap_hooks(model, group.reduce, (group.tap,))
                        extras[group.part] = stack.enter_context(hooks)
                attention = stack.enter_context(capture_attention(model))
                logits, _ = model(self._probe_x)  # (B, T, V)
            if probe and self._repeat_x is not None:
                pending.parts.update(induction_parts(model, self._repeat_x, precision_context))
        finally:
            model.train(was_training)
        if probe:
            pending.parts["output"] = output_statistics(logits)  # (len(PROBE_SCALARS),)
        if probe and tap_stats:
            pending.tap_keys = sorted(tap_stats)
            pending.parts["taps"] = torch.stack([tap_stats[k] for k in pending.tap_keys])
        for part, found in extras.items():
            if found:
                pending.extra_keys[part] = sorted(found)
                pending.parts[part] = torch.stack([found[k] for k in pending.extra_keys[part]])
        layers = sorted(attention)
        if not layers:
            return  # attention is off in this model
        pending.attention_layers = layers
        if probe:
            pending.parts["heads"] = head_statistics(  # (len(ATTENTION_HEAD_STATS), L, nh)
                torch.stack([attention_entropy(attention[layer]) for layer in layers]),
                torch.stack([attention.max_logits[layer] for layer in layers]),
                torch.stack([attention.max_abs_logits[layer] for layer in layers]),
            )
        if sample:
            n = min(self.attention_chars, self._probe_x.size(1))
            maps = [attention[layer][0, :, :n, :n].float() for layer in layers]  # L x (nh, n, n)
            pending.parts["attention"] = torch.stack(maps)  # (L, nh, n, n)
            vocab = getattr(pl_module, "vocab", None) or trainer.datamodule.vocab
            pending.attention_tokens = list(vocab.decode(self._probe_x[0, :n].tolist()))

    def _generate(self, pl_module: L.LightningModule, step: int) -> list[str | None]:
        """Each run's text sample of `step`, in one pass (None for a run whose logits are
        not finite: a diverged model has nothing to say; the run says why)."""
        generate_all = getattr(pl_module, "generate_all", None)
        if generate_all is None or getattr(pl_module, "vocab", None) is None:
            return [None] * len(self.run_sinks)
        self._last_sample_step = step
        return generate_all(
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
        pending, self._pending = self._pending, {}
        if not pending:
            return
        for index, item in pending.items():
            if item.before is not None:
                with torch.no_grad():
                    deltas = torch._foreach_sub(self._indexes[index].params, item.before)
                    item.parts["delta_norm"] = torch.stack(torch._foreach_norm(deltas)).float()
                item.before = None
        self.probe_steps += [item.step for item in pending.values() if GRAD_NORM in item.parts][:1]
        self._write(pending)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A last attention map and text sample of each run's trained model."""
        if not self._indexes:
            return
        step = trainer.global_step
        if self.sampled_at(step):
            return
        pending = {}
        for index, module in self._runs(pl_module):
            pending[index] = _PendingProbe(step=step)
            self._measure_forward(trainer, module, pending[index], probe=False, sample=True)
        texts = self._generate(pl_module, step)
        for index, item in pending.items():
            item.sample = texts[index]
        self._write(pending)
        for sinks in self.run_sinks:
            for sink in sinks:
                sink.flush()

    def _write(self, pending: dict[int, _PendingProbe]) -> None:
        """Move every statistic of each run's pending step to the host in one transfer,
        then hand each run's records to its sinks."""
        hosts = to_host(list(pending.values()))
        for (index, item), host in zip(pending.items(), hosts, strict=True):
            records = self._records_from_host(index, item, host)
            for sink in self.run_sinks[index]:
                sink.write(records)

    def _records_from_host(
        self, run: int, pending: _PendingProbe, host: dict[str, list[float]]
    ) -> ProbeRecords:
        """The host-side records of run `run`'s probe step from its values on the host."""
        step = pending.step
        records = ProbeRecords(step=step, n_layer=self._n_layer)
        rows = records.layer_stats
        if GRAD_NORM in host:
            rows += self._norm_rows(step, self._indexes[run], host)
            records.grad_norm = host["global_grad_norm"][0]
        if "output" in host:
            records.scalars = dict(zip(PROBE_SCALARS, host["output"], strict=True))
        if "taps" in host:
            keys, bins, value_range = pending.tap_keys, self.hist_bins, self.hist_range
            tap_rows, records.histograms = tap_records(step, keys, host["taps"], bins, value_range)
            rows += tap_rows
        for group in TAP_GROUPS:
            if group.part in host:
                rows += group_rows(step, group, pending.extra_keys[group.part], host[group.part])
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
        if pending.sample is not None:
            records.sample = Sample(self.prompt, pending.sample)
        return records

    def _norm_rows(
        self, step: int, index: ParamIndex, host: dict[str, list[float]]
    ) -> list[LayerStat]:
        """grad_norm, param_norm and update_ratio rows of the probed tensors and groups."""
        return norm_rows(step, index, host)
