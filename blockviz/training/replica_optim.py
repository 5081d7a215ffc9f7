"""The update of a stack of replicas: their parameters laid flat, their learning rates on
the device, and AdamW over all of them at once.

`FlatStack` lays the K replicas' stacked parameters end to end in one (K, N) buffer and
their gradients in another (each stacked parameter and its `.grad` are views into them);
`ReplicaSchedule` gives every replica's learning rate for an update as a (K,) tensor on the
device (`lit.lr_at`'s formula); `ReplicaAdamW` is torch's AdamW arithmetic on the buffer's
rows, each with its replica's hyperparameters. A dozen tensor operations a step, whatever
K: no host work per replica and no transfer (`LitReplicas` uses them; docs/replicas.md).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from blockviz.core.config_train import LR_SCHEDULES, TrainConfig

EPS = 1e-8  # torch.optim.AdamW's default, as solo runs use it
CPU_CHUNK = 1 << 15  # columns of the stack a CPU updates at a time

# A stacked parameter is a strided view of the flat buffer, and so is its gradient, on
# purpose (autograd adds into it in place); torch warns that such a pair is unusual.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout")


def replica_values(numbers: Sequence[float], device: torch.device) -> torch.Tensor:
    """Per-replica numbers as a (K,) tensor on `device`: float64 where the device has it,
    as Python's floats are."""
    dtype = torch.float32 if device.type == "mps" else torch.float64
    return torch.tensor([float(n) for n in numbers], dtype=dtype, device=device)


def column(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(K,) per-replica values as a (K, 1) column in `like`'s dtype."""
    return values.to(like.dtype).unsqueeze(1)


@dataclass
class FlatStack:
    """The stacked parameters end to end: `data` (K, N) holds every replica's parameters as
    one row, `grad` (K, N) their gradients; each stacked parameter and its `.grad` are
    views into them (made by `flatten`). The first `n_decay` columns are the parameters
    that decay (Linear matrices, `lit.param_groups`), the rest do not."""

    data: torch.Tensor
    grad: torch.Tensor
    n_decay: int
    columns: dict[int, slice]  # id(parameter) -> its columns

    def view(self, buffer: torch.Tensor, param: nn.Parameter) -> torch.Tensor:
        """`param`'s part of a (K, N) buffer laid out like `data`, shaped as `param`."""
        return buffer[:, self.columns[id(param)]].view(param.shape)

    @classmethod
    def flatten(cls, params: Sequence[nn.Parameter], decays: Sequence[bool]) -> FlatStack:
        """Move `params` ((K, ...) each) into one buffer, the decaying ones first; from
        then on each parameter's data and gradient are views of the buffers."""
        order = [p for p, d in zip(params, decays, strict=True) if d]
        order += [p for p, d in zip(params, decays, strict=True) if not d]
        k = params[0].shape[0]
        sizes = [p[0].numel() for p in order]
        first = params[0]
        data = torch.empty(k, sum(sizes), device=first.device, dtype=first.dtype)
        grad = torch.zeros_like(data)
        flat = cls(data, grad, sum(sizes[: sum(bool(d) for d in decays)]), {})
        offset = 0
        for param, size in zip(order, sizes, strict=True):
            flat.columns[id(param)] = slice(offset, offset + size)
            offset += size
            view = flat.view(data, param)
            view.copy_(param.detach())
            param.data = view
            # Autograd adds a gradient in place into an existing .grad: this view.
            param.grad = flat.view(grad, param)
        return flat


class ReplicaSchedule:
    """Every replica's learning rate for an update, as a (K,) tensor on the device: the
    formula of `lit.lr_at` (warm-up, then constant, cosine or linear to min_lr at the
    horizon) over per-replica tensors, so no step moves a number from the host. float64
    where the device has it, as lr_at computes in Python floats."""

    def __init__(self, trains: Sequence[TrainConfig], horizon: int, device: torch.device) -> None:
        self.lr = replica_values([t.lr for t in trains], device)
        self.min_lr = replica_values([t.min_lr for t in trains], device)
        self.warmup = replica_values([t.warmup_steps for t in trains], device)
        self.kind = torch.tensor([LR_SCHEDULES.index(t.lr_schedule) for t in trains], device=device)
        self.decay_steps = torch.clamp(horizon - self.warmup, min=1.0)

    def __call__(self, update: int) -> torch.Tensor:
        """The K learning rates of optimizer update `update` (0-based)."""
        warm = self.lr * (update + 1) / torch.clamp(self.warmup, min=1.0)
        progress = torch.clamp((update - self.warmup) / self.decay_steps, min=0.0, max=1.0)
        span = self.lr - self.min_lr
        cosine = self.min_lr + 0.5 * (1.0 + torch.cos(math.pi * progress)) * span
        linear = self.lr - progress * span
        after = torch.where(self.kind == 0, self.lr, torch.where(self.kind == 1, cosine, linear))
        return torch.where(update < self.warmup, warm, after)


class ReplicaAdamW(torch.optim.Optimizer):
    """AdamW over the K replicas' parameters at once, with per-replica hyperparameters.

    torch's AdamW (decoupled weight decay, bias-corrected moments, eps outside the square
    root) on the (K, N) rows of a `FlatStack`: each row is updated with its replica's lr
    (`schedule(update)`, (K,)), betas and weight decay, and only the first `n_decay`
    columns decay. Replicas not `alive()` ((K,) bool) get lr 0. The moments are (K, N)
    buffers; `state` holds a view of them per parameter, so a checkpoint keeps the same
    per-parameter layout however the buffers are laid out.
    """

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        flat: FlatStack,
        weight_decay: Sequence[float],
        betas: Sequence[tuple[float, float]],
        schedule: Callable[[int], torch.Tensor],
        alive: Callable[[], torch.Tensor],
    ) -> None:
        super().__init__(list(params), {"lr": 0.0})
        self.flat = flat
        self.schedule = schedule
        self.alive = alive
        device = flat.data.device
        self.weight_decay = replica_values(weight_decay, device)
        self.beta1 = replica_values([b1 for b1, _ in betas], device)
        self.beta2 = replica_values([b2 for _, b2 in betas], device)
        self.exp_avg = torch.zeros_like(flat.data)
        self.exp_avg_sq = torch.zeros_like(flat.data)
        self._point_state()
        self.updates = 0  # optimizer steps taken (restored with the state)

    def _point_state(self) -> None:
        """`state[param]`: views of the moment buffers laid out as `param`."""
        for param in self.param_groups[0]["params"]:
            self.state[param] = {
                "exp_avg": self.flat.view(self.exp_avg, param),
                "exp_avg_sq": self.flat.view(self.exp_avg_sq, param),
            }

    def state_dict(self) -> dict[str, Any]:
        """torch's per-parameter state plus the update count (the schedule's position)."""
        state = super().state_dict()
        state["updates"] = self.updates
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the moments (into the buffers) and the update count."""
        state_dict = dict(state_dict)
        self.updates = int(state_dict.pop("updates", 0))
        super().load_state_dict(state_dict)
        loaded = {p: dict(self.state[p]) for p in self.param_groups[0]["params"]}
        self._point_state()
        with torch.no_grad():
            for param, saved in loaded.items():
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in saved:
                        self.state[param][key].copy_(saved[key])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradient buffer (the parameters' .grad stay its views)."""
        self.flat.grad.zero_()

    def forget(self, index: int) -> None:
        """Zero replica `index`'s moments (a replica masked out)."""
        self.exp_avg[index].zero_()
        self.exp_avg_sq[index].zero_()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One AdamW update of every replica still alive."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        data, grad, n_decay = self.flat.data, self.flat.grad, self.flat.n_decay
        n = self.updates + 1
        lr = torch.where(self.alive(), self.schedule(self.updates), 0.0)
        step_size = column(lr / (1.0 - self.beta1**n), data)
        bias2_sqrt = column(torch.sqrt(1.0 - self.beta2**n), data)
        decay = column(1.0 - lr * self.weight_decay, data)
        beta1, beta2 = column(1.0 - self.beta1, data), column(1.0 - self.beta2, data)
        # The whole stack at once on a GPU; on a CPU in column chunks that stay in its
        # cache (ten passes over a (K, N) buffer measured slower than over its pieces).
        width = data.shape[1] if data.is_cuda else CPU_CHUNK
        for start in range(0, data.shape[1], width):
            cols = slice(start, start + width)
            p, g, m, v = (
                data[:, cols],
                grad[:, cols],
                self.exp_avg[:, cols],
                self.exp_avg_sq[:, cols],
            )
            if start < n_decay:
                p[:, : n_decay - start].mul_(decay)
            m.lerp_(g, beta1)
            v.lerp_(g * g, beta2)  # beta2·v + (1 − beta2)·g²
            denom = v.sqrt().div_(bias2_sqrt).add_(EPS).div_(step_size)
            p.addcdiv_(m, denom, value=-1.0)
        self.updates += 1
        return loss
