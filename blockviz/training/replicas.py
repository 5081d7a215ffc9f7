"""Replicas: K runs of the same shapes trained as one batched model (PyTorch's model
ensembling with torch.func: `stack_module_state` + `functional_call` + `vmap`).

`LitReplicas` is the LightningModule of a batch. Each replica is first built exactly as
its solo run builds its model (`seed_everything(seed)`, then `LitCharModel`), so it starts
from the solo run's weights; the K models' parameters are then stacked into one tensor per
parameter, (K, ...), and a training step calls the model through `functional_call` on the
stacked parameters and K batches, (K, B, T): once under `vmap` on a GPU, or once per
replica over views of the stack on a CPU, where vmap's batched products and its per-replica
fallback for CPU attention measured slower (docs/replicas.md). The replicas share no
arithmetic: the objective is the sum of their losses, so each replica's gradient is its
own loss's gradient.

What each replica keeps on its own (`core.replicas.PER_REPLICA_FIELDS`): its seed (its
initial weights and its data order), the AdamW hyperparameters (lr and its schedule,
weight decay, betas), gradient clipping (on its own global norm) and the z-loss. The
update is `ReplicaAdamW`, torch's AdamW written over the stacked tensors with one value of
each hyperparameter per replica.

A replica whose loss stops being finite is masked out: `alive` (a buffer, so checkpoints
carry it) turns False, its parameters, gradients and optimizer state are zeroed and its
learning rate is 0, so it computes finite zeros from then on and the rest go on.

Each replica also has a `LitCharModel` of its own whose parameters are views into the
stacked tensors (`views`): the probes, text samples and final metrics use it as they use a
solo run's module, reading the replica's slice without copying it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap
from torch.optim.adam import adam

from blockviz.core.config import RunConfig
from blockviz.training.data import answer_accuracy, baseline_score
from blockviz.training.lit import CompiledModel, LitCharModel, lr_at, param_groups, val_metrics

EPS = 1e-8  # torch.optim.AdamW's default, as solo runs use it
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def _key(name: str) -> str:
    """A parameter name as a ParameterDict key (dots are not allowed there)."""
    return name.replace(".", "__")


class ReplicaAdamW(torch.optim.Optimizer):
    """AdamW over stacked (K, ...) parameters, each replica updated by torch's own AdamW.

    Each step calls `torch.optim.adam.adam` (the function `torch.optim.AdamW.step` calls)
    once per live replica and parameter group, on views of that replica's slices of the
    parameters, gradients and moments, with its own lr, betas and weight decay, the groups
    in the order `lit.param_groups` gives a solo run (matrices decay, the rest do not). So
    the arithmetic is the solo run's, operation for operation. `lr_of(update)` gives the K
    learning rates of update `update` (0-based), as each solo run's LambdaLR sets them;
    `live()` says which replicas are still training (the others are not updated; their
    weights, gradients and moments are zeroed).
    """

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        decays: Sequence[bool],
        weight_decay: Sequence[float],
        betas: Sequence[tuple[float, float]],
        lr_of: Callable[[int], list[float]],
        live: Callable[[], list[bool]],
    ) -> None:
        super().__init__(list(params), {"lr": 0.0})
        self.decays = list(decays)
        self.weight_decay = [float(w) for w in weight_decay]
        self.betas = [(float(b1), float(b2)) for b1, b2 in betas]
        self.lr_of = lr_of
        self.live = live
        self.updates = 0  # optimizer steps taken (restored with the state)

    def state_dict(self) -> dict[str, Any]:
        """torch's state plus the update count (the lr schedule's position)."""
        state = super().state_dict()
        state["updates"] = self.updates
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the moments, steps and the update count."""
        state_dict = dict(state_dict)
        self.updates = int(state_dict.pop("updates", 0))
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One AdamW update of every replica still alive."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for p in self.param_groups[0]["params"] if p.grad is not None]
        if not params:
            return loss
        for param in params:
            state = self.state[param]
            if not state:
                state["exp_avg"] = torch.zeros_like(param)
                state["exp_avg_sq"] = torch.zeros_like(param)
                # torch keeps a float32 step per parameter on the CPU; one per replica here
                state["step"] = torch.zeros(param.shape[0], dtype=torch.float32)
        alive = self.live()
        dead = torch.tensor([i for i, a in enumerate(alive) if not a], dtype=torch.long)
        if dead.numel():
            for param in params:
                state = self.state[param]
                for tensor in (param, param.grad, state["exp_avg"], state["exp_avg_sq"]):
                    tensor.index_fill_(0, dead.to(tensor.device), 0.0)
        lrs = self.lr_of(self.updates)
        flagged = zip(self.param_groups[0]["params"], self.decays, strict=True)
        with_grad = [(p, decay) for p, decay in flagged if p.grad is not None]
        groups = [[p for p, d in with_grad if d], [p for p, d in with_grad if not d]]
        for i, live in enumerate(alive):
            if not live:
                continue
            beta1, beta2 = self.betas[i]
            for group, decay in zip(groups, (self.weight_decay[i], 0.0), strict=True):
                if not group:
                    continue
                states = [self.state[p] for p in group]
                adam(
                    [p[i] for p in group],
                    [p.grad[i] for p in group],
                    [s["exp_avg"][i] for s in states],
                    [s["exp_avg_sq"][i] for s in states],
                    [],
                    [s["step"][i] for s in states],
                    amsgrad=False,
                    beta1=beta1,
                    beta2=beta2,
                    lr=lrs[i],
                    weight_decay=decay,
                    eps=EPS,
                    maximize=False,
                    decoupled_weight_decay=True,
                )
        self.updates += 1
        return loss


class LitReplicas(L.LightningModule):
    """K replicas of one CharTransformer shape, trained as one vmapped model.

    `run_configs`: each replica's `RunConfig.to_dict()` (equal but for the per-replica
    fields); `vocab_json` as LitCharModel takes it. The checkpoint holds the stacked
    parameters, `alive` and `diverged_at`, and ReplicaAdamW's state.
    """

    def __init__(
        self,
        run_configs: list[dict[str, Any]],
        vocab_json: str | None = None,
        schedule_steps: int | None = None,
        vectorize: bool | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["vectorize"])
        self.configs = [RunConfig.from_dict(c).validate() for c in run_configs]
        self.k = len(self.configs)
        self.schedule_steps = schedule_steps or self.configs[0].train.max_steps
        # Each replica built as its solo run builds its module, so its initial weights are
        # the solo run's; plain list: these modules are views, not this module's children.
        self.views: list[LitCharModel] = []
        for config in self.configs:
            L.seed_everything(config.train.seed, workers=False, verbose=False)
            self.views.append(
                LitCharModel(config.to_dict(), vocab_json, schedule_steps=self.schedule_steps)
            )
        models = [view.model for view in self.views]
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
        # Every name each stacked tensor goes by (a tied embedding is also the head).
        aliases: dict[int, list[str]] = {}
        for name, param in models[0].named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(name)
        self.aliases = [aliases[id(by_name[n])] for n in self.names]
        self.template = CompiledModel(copy.deepcopy(models[0]).to("meta"))
        self.register_buffer("alive", torch.ones(self.k, dtype=torch.bool))
        # `alive` on the host: read every step without a device sync (the buffer is what a
        # checkpoint keeps; `on_load_checkpoint` reads it back)
        self.live = [True] * self.k
        self.register_buffer("diverged_at", torch.full((self.k,), -1, dtype=torch.long))
        self.vocab = self.views[0].vocab
        self.is_ops = self.views[0].is_ops
        self.z_loss = [c.train.z_loss for c in self.configs]
        self.clip = [c.train.grad_clip for c in self.configs]
        self.replica_loggers: list[list[Any]] = [[] for _ in range(self.k)]
        # vmap on a GPU; on a CPU a loop over the replicas inside the step, which measured
        # faster there (docs/replicas.md). None: chosen by the device; True / False: forced.
        self.vectorize = vectorize
        self._viewed_device: torch.device | None = None
        self._val_sum: torch.Tensor | None = None
        self._val_batches = 0
        self._answers: list[list[int]] = []
        self._baseline = [0, 0]
        self._answer_table: dict[str, str] | None = None

    # -- the stacked parameters ----------------------------------------------------------

    def stacked_params(self) -> list[nn.Parameter]:
        """The (K, ...) parameters, in `names` order."""
        return [self.stacked[_key(n)] for n in self.names]

    def make_views(self) -> list[LitCharModel]:
        """Point each replica's LitCharModel at its slice of the stacked tensors (again after
        a move to another device); the views share storage with the stack."""
        device = self.stacked_params()[0].device
        if self._viewed_device == device:
            return self.views
        for i, view in enumerate(self.views):
            for stacked, names in zip(self.stacked_params(), self.aliases, strict=True):
                slice_param = nn.Parameter(stacked.detach()[i])
                for name in names:
                    owner, _, leaf = name.rpartition(".")
                    setattr(view.model.get_submodule(owner), leaf, slice_param)
            view.to(device)
        self._viewed_device = device
        return self.views

    def share_grads(self, index: int) -> None:
        """Give replica `index`'s view the gradient slices (for the probes to read)."""
        view = self.views[index]
        for stacked, names in zip(self.stacked_params(), self.aliases, strict=True):
            grad = stacked.grad[index] if stacked.grad is not None else None
            param = view.model.get_parameter(names[0])
            param.grad = grad

    def _run(self, x: torch.Tensor, y: torch.Tensor, shared_batch: bool) -> Any:
        """(logits (K, B, T, V), losses (K,)): the model once per replica under vmap."""
        template = self.template.wrapper
        # Every alias named: moving the template to "meta" unties a tied embedding.
        params = {
            alias: p
            for names, p in zip(self.aliases, self.stacked_params(), strict=True)
            for alias in names
        }

        def one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> Any:
            return functional_call(template, p, (xi, yi))

        vectorize = self.vectorize
        if vectorize is None:
            vectorize = self.stacked_params()[0].device.type == "cuda"
        if vectorize:
            dims = (0, None, None) if shared_batch else (0, 0, 0)
            return vmap(one, in_dims=dims, randomness="different")(params, x, y)
        # One replica after another over views of the stack (unbind: one view per replica,
        # and one stacking copy of the gradients in the backward pass). A replica masked
        # out costs nothing: zeros stand in for its outputs.
        views = {name: tensor.unbind(0) for name, tensor in params.items()}
        alive = self.live
        wanted = [i for i in range(self.k) if alive[i]] or [0]  # shapes even with none live
        outputs = {
            i: one(
                {name: parts[i] for name, parts in views.items()},
                x if shared_batch else x[i],
                y if shared_batch else y[i],
            )
            for i in wanted
        }
        live_logits, live_loss = next(iter(outputs.values()))
        dead = (torch.zeros_like(live_logits), torch.zeros_like(live_loss))
        logits, losses = zip(*(outputs.get(i, dead) for i in range(self.k)), strict=True)
        return torch.stack(logits), torch.stack(losses)

    # -- training ------------------------------------------------------------------------

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        """{"loss": the sum of the live replicas' objectives, "ce": each one's (K,) loss}."""
        x, y = batch  # (K, B, T) each
        logits, ce = self._run(x, y, shared_batch=False)  # (K, B, T, V), (K,)
        # Each live replica's objective as its solo run computes it: the cross-entropy, plus
        # PaLM's z-loss where its coefficient is not 0.
        objectives = []
        for i, (coefficient, live) in enumerate(zip(self.z_loss, self.live, strict=True)):
            if not live:
                continue
            if coefficient == 0:
                objectives.append(ce[i])
            else:
                log_z = logits[i].float().logsumexp(dim=-1)  # (B, T)
                objectives.append(ce[i] + coefficient * log_z.pow(2).mean())
        return {"loss": torch.stack(objectives).sum(), "ce": ce.detach()}

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
    ) -> None:
        """Each live replica's gradient clipped to its own `grad_clip` by its own global norm,
        as `clip_grad_norm_` clips a solo run's (its tensors in the solo optimizer's order,
        torch's own norm); 0 leaves a replica's gradient alone."""
        params = self.stacked_params()
        order = [p for p, d in zip(params, self.decays, strict=True) if d]
        order += [p for p, d in zip(params, self.decays, strict=True) if not d]
        order = [p for p in order if p.grad is not None]
        if not order:
            return
        for i, (limit, live) in enumerate(zip(self.clip, self.live, strict=True)):
            if not limit or not live:
                continue
            grads = [p.grad[i] for p in order]
            total = torch.nn.utils.get_total_norm(grads)
            coefficient = torch.clamp(limit / (total + CLIP_EPS), max=1.0)
            torch._foreach_mul_(grads, coefficient)

    def lr_of(self, update: int) -> list[float]:
        """Each replica's learning rate for optimizer update `update`, as its solo run's
        LambdaLR computes it (base lr times the schedule's multiplier)."""
        rates = []
        for config in self.configs:
            train = config.train
            rates.append(train.lr * (lr_at(update, train, self.schedule_steps) / train.lr))
        return rates

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """ReplicaAdamW: each replica's AdamW on its slice (no Lightning scheduler: the
        optimizer computes each replica's schedule itself)."""
        return ReplicaAdamW(
            self.stacked_params(),
            self.decays,
            [c.train.weight_decay for c in self.configs],
            [(c.train.beta1, c.train.beta2) for c in self.configs],
            self.lr_of,
            lambda: self.live,
        )

    def mark_diverged(self, index: int, step: int) -> None:
        """Mask replica `index` out from now on, recording the step it diverged at."""
        self.diverged_at[index] = step
        self.mask(index)

    def mask(self, index: int) -> None:
        """Replica `index` trains no more: not in the objective, its weights, gradients
        (and, in ReplicaAdamW, moments) zeroed, so it computes finite zeros."""
        self.alive[index] = False
        self.live[index] = False
        with torch.no_grad():
            for param in self.stacked_params():
                param[index].zero_()
                if param.grad is not None:
                    param.grad[index].zero_()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A resumed batch: which replicas were still training when it was saved."""
        saved = checkpoint.get("state_dict", {}).get("alive")
        if saved is not None:
            self.live = [bool(a) for a in saved.tolist()]

    # -- validation ----------------------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        """Reset the per-replica accumulators of one evaluation."""
        self._val_sum = torch.zeros(self.k, device=self.device)
        self._val_batches = 0
        self._answers = [[0, 0] for _ in range(self.k)]
        self._baseline = [0, 0]
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        self._answer_table = getattr(datamodule, "answer_table", None)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        """Every replica scores the same evaluation batch (B, T): the text is one ruler."""
        x, y = batch
        logits, losses = self._run(x, y, shared_batch=True)  # (K, B, T, V), (K,)
        self._val_sum = self._val_sum + losses.detach().float()
        self._val_batches += 1
        if self.is_ops and self.vocab is not None:
            predictions = logits.argmax(dim=-1)  # (K, B, T)
            for i in range(self.k):
                correct, total = answer_accuracy(x, y, predictions[i], self.vocab)
                self._answers[i][0] += correct
                self._answers[i][1] += total
            if self._answer_table is not None:
                right, scored = baseline_score(x, y, self.vocab, self._answer_table)
                self._baseline[0] += right
                self._baseline[1] += scored

    def on_validation_epoch_end(self) -> None:
        """val/loss, val/bpc, val/ppl (and the ops answers) of each live replica, to its
        loggers; each view's `last_val` as its solo module would hold it."""
        if not self._val_batches or self._val_sum is None:
            return
        # One transfer; the mean in Python, as a solo run takes it.
        means = [total / self._val_batches for total in self._val_sum.tolist()]
        for i, mean_loss in enumerate(means):
            if not self.live[i]:
                continue
            answers = self._answers[i] if self.is_ops else None
            table = self.is_ops and self._answer_table is not None
            metrics = val_metrics(mean_loss, answers, self._baseline if table else None)
            for logger in self.replica_loggers[i]:
                logger.log_metrics(metrics, step=self.global_step)
            self.views[i].last_val = {"step": self.global_step, **metrics}
