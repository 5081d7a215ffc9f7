"""Replicas: K runs of the same shapes trained as one batched model.

`LitReplicas` is the LightningModule of a batch. Each replica's model is first built
exactly as its solo run builds it (`seed_everything(seed)`, then `CharTransformer`), so it
starts from the solo run's weights; the K models' parameters are then stacked, one (K, ...)
tensor per parameter, and a training step calls the model once through `functional_call`
on the stacked parameters and K batches, (K, B, T): the model takes stacked parameters
natively (`blockviz.training.model` says how, fused attention kernels included), so no
vmap and no loop over the replicas. The replicas share no arithmetic: the objective is
the sum of their losses, so each replica's gradient is its own loss's gradient.

What each replica keeps on its own (`core.replicas.PER_REPLICA_FIELDS`): its seed (its
initial weights and its data order), the AdamW hyperparameters (lr and its schedule,
weight decay, betas), gradient clipping (on its own global norm) and the z-loss; each is
a (K,) tensor on the device. When the optimizer is made, the stacked parameters are laid
end to end in one (K, N) buffer, their gradients in another (`replica_optim.FlatStack`),
so the update (`ReplicaAdamW`) and the clipping are a dozen tensor operations on the
whole stack, whatever K: no host work per replica, no transfer.

A replica whose loss stops being finite is masked out: `alive` (a buffer, so checkpoints
carry it) turns False, its parameters, gradients and moments are zeroed and its learning
rate is 0, so it computes finite zeros from then on and the rest go on.

The probe measures all K replicas at once on `stack()` (the stacked parameters and their
gradients, run by the template model), as it measures a solo run as a stack of one. Each
replica's latest evaluation is in `last_vals`, for its final metrics. The Trainer's one
`TrainingMonitor` logs each replica's train/* rows (`live`, `run_lrs`, `log_run`).

Equality to the solo runs: the same initial weights and data, and the same formulas in
another order (one batched product where the solo run multiplies once per run, AdamW's
arithmetic on (K, N) rows): a replica equals its solo run to float32 rounding on a CPU,
and to the rounding of the run's precision (bf16-mixed) on a GPU (docs/replicas.md).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn
from torch.func import functional_call, stack_module_state

from blockviz.training.lit import CompiledModel, OneStep, lr_at, param_groups, prompt_ids
from blockviz.training.model import CharTransformer, ModelInputError
from blockviz.training.probe_stats import RunStack, parameter_names
from blockviz.training.replica_optim import FlatStack, ReplicaAdamW, ReplicaSchedule, column

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def _key(name: str) -> str:
    """A parameter name as a ParameterDict key (dots are not allowed there)."""
    return name.replace(".", "__")


class LitReplicas(OneStep):
    """K replicas of one CharTransformer shape, trained as one batched model.

    `run_configs`: each replica's `RunConfig.to_dict()` (equal but for the per-replica
    fields); `vocab_json` as LitCharModel takes it. The checkpoint holds the stacked
    parameters, `alive` and `diverged_at`, and ReplicaAdamW's state.
    """

    def __init__(
        self,
        run_configs: list[dict[str, Any]],
        vocab_json: str | None = None,
        schedule_steps: int | None = None,
    ) -> None:
        super().__init__(run_configs, vocab_json, schedule_steps)
        self.save_hyperparameters()
        self.k = len(self.configs)
        # Each replica's model built as its solo run builds it (`fit.fit`, LitCharModel), so
        # its initial weights are the solo run's.
        models = []
        for config in self.configs:
            L.seed_everything(config.train.seed, workers=False, verbose=False)
            models.append(CharTransformer(config.model))
        params, buffers = stack_module_state(models)
        if buffers:
            raise ValueError(f"replicas cannot batch a model with buffers ({sorted(buffers)})")
        self.names = list(params)
        self.stacked = nn.ParameterDict(
            {_key(n): nn.Parameter(params[n].detach().clone()) for n in self.names}
        )
        decay_ids = {id(p) for p in param_groups(models[0], 1.0)[0]["params"]}
        by_name = dict(models[0].named_parameters())
        self.decays = [id(by_name[n]) in decay_ids for n in self.names]
        _, self.aliases = parameter_names(models[0])  # a tied embedding is also the head
        self.template = CompiledModel(models[0].to("meta"))  # the stack holds the weights
        # `compile true`: the batched forward through torch.compile (the stacked
        # parameters are its inputs, so one graph serves every step).
        forward = self._stacked_forward
        self._forward = torch.compile(forward) if self.configs[0].train.compile else forward
        # `live` is `alive` on the host: read every step without a device sync (the buffer
        # is what a checkpoint keeps; `on_load_checkpoint` reads it back)
        self.register_buffer("alive", torch.ones(self.k, dtype=torch.bool))
        self.register_buffer("diverged_at", torch.full((self.k,), -1, dtype=torch.long))
        # Per-replica z-loss and clipping, as buffers so they follow the module's device.
        z_loss = [c.train.z_loss for c in self.configs]
        self.has_z_loss = any(z_loss)
        self.register_buffer("z_loss", torch.tensor(z_loss), persistent=False)
        clips = [c.train.grad_clip for c in self.configs]
        self.has_clip = any(clips)
        self.register_buffer("clip", torch.tensor(clips), persistent=False)
        self.replica_loggers: list[list[Any]] = [[] for _ in range(self.k)]
        self.out: list[int] = []  # replicas that finished before this session (the fit's)
        self.flat: FlatStack | None = None  # made with the optimizer
        self._optimizer: ReplicaAdamW | None = None

    # -- the stacked parameters ----------------------------------------------------------

    def stacked_params(self) -> list[nn.Parameter]:
        """The (K, ...) parameters, in `names` order."""
        return [self.stacked[_key(n)] for n in self.names]

    def stack(self) -> RunStack:
        """The stacked parameters and their gradients (views of the flat buffers), run by
        the template model: what the steps and the probe call."""
        params = self.stacked_params()
        grads = [p.grad for p in params]
        return RunStack(self.template.wrapper, self.names, params, grads, self.aliases)

    def on_fit_start(self) -> None:
        """Mask out the replicas that finished before this session (`out`)."""
        for index in self.out:
            self.mask(index)

    def score(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        """(logits (K, B, T, V), losses (K,)) of token ids (K, B, T), or of one batch
        (B, T) that every replica scores: the model once, on the stacked parameters."""
        if x.dim() == 2:
            x, y = x.expand(self.k, *x.shape), y.expand(self.k, *y.shape)
        # every alias named: moving the template to "meta" untied a tied embedding
        return self._forward(self.stack().by_alias(), x, y)

    def _stacked_forward(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> Any:
        return functional_call(self.template.wrapper, params, (x, y))

    # -- training ------------------------------------------------------------------------

    def objective(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """The sum of the live replicas' objectives, and {"ce": each one's (K,) loss}."""
        x, y = batch  # (K, B, T) each
        logits, ce = self.score(x, y)  # (K, B, T, V), (K,)
        # Each replica's objective as its solo run computes it: the cross-entropy, plus
        # PaLM's z-loss where its coefficient is not 0.
        objective = ce
        if self.has_z_loss:
            log_z = logits.float().logsumexp(dim=-1)  # (K, B, T)
            objective = ce + self.z_loss * log_z.pow(2).mean(dim=(1, 2))
        # A masked replica adds nothing (and gets no gradient), whatever its loss.
        live = torch.where(self.alive, objective, torch.zeros_like(objective))
        loss = live.sum()
        return loss, {"loss": loss.detach(), "ce": ce.detach()}

    def configure_gradient_clipping(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        """Each replica's gradient clipped to its own `grad_clip` by its own global norm
        (the norm of its row of the gradient buffer), as `clip_grad_norm_` clips a solo
        run's; 0 leaves a replica's gradient alone."""
        if not self.has_clip or self.flat is None:
            return
        grad = self.flat.grad  # (K, N)
        total = torch.linalg.vector_norm(grad, dim=1)  # (K,)
        coefficient = torch.clamp(self.clip / (total + CLIP_EPS), max=1.0)
        coefficient = torch.where(self.clip > 0, coefficient, torch.ones_like(coefficient))
        grad.mul_(column(coefficient, grad))

    def run_lrs(self) -> list[float]:
        """Each replica's learning rate for the coming update, as its solo run's LambdaLR
        computes it (on the host: what the monitor logs)."""
        update = self.global_step
        # base lr times the schedule's multiplier, as LambdaLR computes it
        return [
            c.train.lr * (lr_at(update, c.train, self.schedule_steps) / c.train.lr)
            for c in self.configs
        ]

    def log_run(self, index: int, metrics: dict[str, float], step: int) -> None:
        """Replica `index`'s metrics to its own loggers at `step`."""
        for logger in self.replica_loggers[index]:
            logger.log_metrics(metrics, step=step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """ReplicaAdamW over the stack laid flat (no Lightning scheduler: the optimizer
        computes each replica's schedule itself, on the device)."""
        params = self.stacked_params()
        self.flat = FlatStack.flatten(params, self.decays)
        self._optimizer = ReplicaAdamW(
            params,
            self.flat,
            [c.train.weight_decay for c in self.configs],
            [(c.train.beta1, c.train.beta2) for c in self.configs],
            ReplicaSchedule([c.train for c in self.configs], self.schedule_steps, self.device),
            lambda: self.alive,
        )
        return self._optimizer

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients, which stay views of the flat buffer once it exists
        (Lightning zeroes the module's gradients as each fit or validation starts; set to
        None, autograd would make new tensors the optimizer never sees)."""
        if self.flat is None:
            super().zero_grad(set_to_none)
        else:
            self.flat.grad.zero_()

    def mark_diverged(self, index: int, step: int) -> None:
        """Mask replica `index` out from now on, recording the step it diverged at."""
        self.diverged_at[index] = step
        self.mask(index)

    def mask(self, index: int) -> None:
        """Replica `index` trains no more: not in the objective, its weights, gradients
        and moments zeroed, so it computes finite zeros."""
        self.alive[index] = False
        self.live[index] = False
        with torch.no_grad():
            for param in self.stacked_params():
                param[index].zero_()
                if param.grad is not None:
                    param.grad[index].zero_()
            if self._optimizer is not None:
                self._optimizer.forget(index)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A resumed batch: which replicas were still training when it was saved."""
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get("state_dict", {}).get("alive")
        if saved is not None:
            self.live = [bool(a) for a in saved.tolist()]

    # -- text samples --------------------------------------------------------------------

    @torch.inference_mode()
    def generate_all(
        self,
        prompt: str,
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> list[str | None]:
        """Every replica's text sampled after `prompt`, in one stacked pass a character
        (LitCharModel.generate for K models at once, drawn under one `seed`); None for a
        replica whose logits are not finite."""
        if self.vocab is None:
            raise ModelInputError("this model has no vocabulary; build it with vocab_json")
        first = self.stacked_params()[0]
        context = prompt_ids(self.vocab, prompt, self.configs[0].model.block_size, first.device)
        context = context.expand(self.k, *context.shape).contiguous()  # (K, 1, T)
        params = self.stack().by_alias()
        broken = torch.zeros(self.k, dtype=torch.bool, device=first.device)

        def forward(ids: torch.Tensor) -> tuple[torch.Tensor, None]:
            nonlocal broken
            # eager: a compiled forward would recompile for every context length
            logits, _ = self._stacked_forward(params, ids, None)  # (K, 1, T, V)
            bad = ~torch.isfinite(logits).all(dim=-1).all(dim=-1).all(dim=-1)  # (K,)
            broken = broken | bad
            return torch.where(bad[:, None, None, None], 0.0, logits), None

        cuda = [first.device.index or 0] if first.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            template = self.template.wrapper
            out = template.generate(context, max_new_tokens, temperature, top_k, forward)
        failed = broken.tolist()
        start = context.size(-1)
        return [
            None if failed[i] else self.vocab.decode(out[i, 0, start:].tolist())
            for i in range(self.k)
        ]
