"""LitCharModel: what one training step of a CharTransformer is.

The LightningModule owns the science: next-character cross-entropy (plus PaLM's z-loss
when the config asks for it), validation metrics, AdamW with decay / no-decay groups and
the warm-up + decay schedule, text generation.
The Trainer owns the engineering (device, precision, DDP, checkpoints) and is built by
`blockviz.training.trainer.make_trainer` from the run config. Monitoring lives in
callbacks: train metrics, clocks and divergence in `blockviz.training.callbacks`, the
per-layer probes in `blockviz.training.probes`.

Metric steps: a number recorded "at step s" describes the model after s optimizer
updates; validation at step s runs after s updates.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch import nn

from blockviz.core import spec
from blockviz.core.config import RunConfig
from blockviz.core.config_train import TrainConfig
from blockviz.core.vocab import CharVocab
from blockviz.training.data import answer_accuracy, baseline_predictions
from blockviz.training.model import CharTransformer, ModelInputError, NonFiniteLogits
from blockviz.training.probe_stats import RunStack

LN2 = math.log(2.0)
RNG_KEY = "blockviz_rng"  # checkpoint entry: torch's random state when it was written


def lr_at(step: int, train: TrainConfig, horizon: int | None = None) -> float:
    """The learning rate used for optimizer update `step` (0-based).

    Linear warm-up from lr/warmup_steps to lr over the first warmup_steps updates, then
    constant, or a cosine / linear decay that reaches min_lr at `horizon` (default
    max_steps) and stays there. A run resumed with a larger max_steps keeps the horizon
    it started with, so its schedule never jumps mid-run.
    """
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.lr_schedule == "constant":
        return train.lr
    end = train.max_steps if horizon is None else horizon
    decay_steps = max(1, end - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / decay_steps)
    if train.lr_schedule == "cosine":
        return train.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (train.lr - train.min_lr)
    return train.lr - progress * (train.lr - train.min_lr)  # linear


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: Linear weight matrices decay; biases, norms and embeddings do not.

    A tied embedding / LM-head matrix is the head Linear's weight too, so it decays.
    """
    decay_ids = {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, nn.Linear) and module.weight.dim() >= 2
    }
    decay, no_decay = [], []
    for param in model.parameters():  # each shared tensor is yielded once
        if param.requires_grad:
            (decay if id(param) in decay_ids else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def val_metrics(
    mean_loss: float, answers: list[int] | None = None, baseline: list[int] | None = None
) -> dict[str, float]:
    """An evaluation's val/loss, val/bpc (= loss / ln 2) and val/ppl; with the ops task's
    (correct, total) answers val/answer_acc, and the trivial baseline's val/answer_baseline."""
    metrics = {
        spec.VAL_LOSS: mean_loss,
        spec.VAL_BPC: mean_loss / LN2,
        spec.VAL_PPL: math.exp(mean_loss) if mean_loss < 700 else math.inf,
    }
    if answers is not None:
        correct, total = answers
        metrics[spec.VAL_ANSWER_ACC] = correct / total if total else math.nan
    if baseline is not None:
        right, scored = baseline
        metrics[spec.VAL_ANSWER_BASELINE] = right / scored if scored else math.nan
    return metrics


def prompt_ids(vocab: CharVocab, prompt: str, block_size: int, device: Any) -> torch.Tensor:
    """A sampling prompt as ids (1, T): characters the vocabulary lacks replaced, at most
    block_size of them, and an empty prompt a newline (or the first symbol)."""
    ids = vocab.encode(prompt, replace_unknown=True)
    if not ids:
        ids = [vocab.index("\n") if "\n" in vocab else 0]
    return torch.tensor([ids[-block_size:]], dtype=torch.long, device=device)  # (1, T)


def clip_norm_(optimizer: torch.optim.Optimizer, max_norm: float) -> None:
    """`clip_grad_norm_` of the optimizer's gradients, its arithmetic without its host work.

    torch's function groups the tensors by device and dtype twice and checks its inputs
    on every call (about 1 ms of host time a step on the H100 box: BENCHMARKS.md, "Solo
    step host work"); this computes the same norms, in the same order, in a few calls. On
    a CPU the for-each norm and multiply are torch's per-tensor ones, so a run's numbers
    are `clip_grad_norm_`'s bit for bit (`tests/training/test_solo_step.py`).
    """
    grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
    grads = [grad for grad in grads if grad is not None]
    if not grads:
        return
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # clip_grad_norm_'s eps
    torch._foreach_mul_(grads, coefficient)


def compile_mode(device: torch.device, world_size: int) -> str | None:
    """torch.compile's mode for a run's step: on a single GPU "reduce-overhead", which
    replays the compiled forward and backward as CUDA graphs (a small model's step is
    bound by launching its kernels: BENCHMARKS.md, "Solo step host work"); torch's
    default elsewhere (a CPU has no graphs; several ranks keep the plain compiled step)."""
    return "reduce-overhead" if device.type == "cuda" and world_size == 1 else None


@dataclass(frozen=True)
class CompiledModel:
    """torch.compile's wrapper of the model, kept out of the LightningModule's submodules.

    nn.Module registers every module assigned to one of its attributes, and the wrapper
    registered too would add an `_orig_mod.` copy of every state_dict key, so checkpoints
    would differ with compile on or off. Held in this plain object it is only a faster
    way to call the same parameters.
    """

    wrapper: nn.Module


class OneStep(L.LightningModule):
    """A LightningModule whose training step is one call: the objective, the backward
    pass, the optimizer's update and the schedule (Lightning's manual optimization).

    Lightning's automatic optimization wraps the same work in a closure and a dozen
    dispatched hooks a step, host work that bounds a small model's step on a GPU
    (BENCHMARKS.md, "Solo step host work"). The arithmetic and its order are what the
    automatic loop ran: forward, zero_grad, backward (outside autocast), the callbacks'
    `on_before_optimizer_step` (the probes read unclipped gradients), clipping
    (`configure_gradient_clipping`), the update, then the schedule. `LitCharModel` and
    `LitReplicas` share it; each says what its `objective` is.

    It also says which runs it trains (`configs`: one for `LitCharModel`, K for
    `LitReplicas`), as `callbacks.TrainingMonitor` logs them (`live`, `run_lrs`, `log_run`).
    `last_vals` holds each run's latest evaluation (what its final metrics report).
    """

    def __init__(
        self, run_configs: list[dict[str, Any]], vocab_json: str | None, schedule_steps: int | None
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.configs = [RunConfig.from_dict(c).validate() for c in run_configs]
        # The step where the lr decay ends: max_steps, or what the runs first had when a
        # resume extends it (the checkpoint's hyperparameters carry it on).
        self.schedule_steps = schedule_steps or self.configs[0].train.max_steps
        self.vocab = CharVocab.from_json(vocab_json) if vocab_json else None
        self.is_ops = self.configs[0].data.dataset == "ops"
        self.live = [True for _ in self.configs]  # which of the module's runs still train
        self.last_vals: list[dict[str, float]] = [{} for _ in self.configs]  # with its step
        self._val_batches = 0  # batches of the evaluation under way

    def run_lrs(self) -> list[float]:
        """Each run's learning rate for the coming update (`global_step`)."""
        return [self.trainer.optimizers[0].param_groups[0]["lr"]]

    def log_run(self, index: int, metrics: dict[str, float], step: int) -> None:
        """Run `index`'s metrics to its loggers at `step`."""
        # Straight to the loggers with an explicit step: Lightning's own step counter for
        # logged metrics is off by one against ours and would need a sync per self.log.
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    def objective(self, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss to minimise and what `on_train_batch_end` receives."""
        raise NotImplementedError

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        """One update: objective, backward, clipping and the optimizer's step, schedule."""
        optimizer = self.optimizers()
        loss, outputs = self.objective(batch)
        optimizer.zero_grad()
        # The backward pass runs outside autocast, as the automatic loop runs it.
        with torch.autocast(self.device.type, enabled=False):
            self.manual_backward(loss)
        optimizer.step()  # the callbacks' on_before_optimizer_step, then ours: clipping
        scheduler = self.lr_schedulers()
        if scheduler is not None:
            scheduler.step()
        return outputs

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip the gradients, after the callbacks (the probes) have read them."""
        self.configure_gradient_clipping(optimizer)

    # -- validation: every run scores the same evaluation batches ------------------------

    def score(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each run's logits (K, B, T, V) and loss (K,) of one evaluation batch (B, T)."""
        raise NotImplementedError

    def stack(self) -> RunStack:
        """Every run's parameters and gradients, (K, ...) each, and the model that runs
        them: what a probe step measures, all K at once."""
        raise NotImplementedError

    def n_params(self) -> int:
        """Each run's number of parameters (a tied matrix once)."""
        return sum(param[0].numel() for param in self.stack().params)

    def on_validation_epoch_start(self) -> None:
        """Reset the accumulators of one evaluation."""
        self._val_sum = torch.zeros(len(self.live), device=self.device)
        self._val_batches = 0
        self._answers = [[0, 0] for _ in self.live]  # each run's correct, total (ops only)
        self._baseline = [0, 0]  # the trivial baseline's correct, total on the same answers
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        self._answer_table = getattr(datamodule, "answer_table", None)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        """Accumulate each run's loss (and ops answers) of one batch on the device."""
        x, y = batch  # (B, T), (B, T)
        logits, losses = self.score(x, y)  # (K, B, T, V), (K,)
        self._val_sum = self._val_sum + losses.detach().float()
        self._val_batches += 1
        if self.is_ops and self.vocab is not None:
            predictions = logits.argmax(dim=-1)  # (K, B, T)
            for answers, predicted in zip(self._answers, predictions, strict=True):
                correct, total = answer_accuracy(x, y, predicted, self.vocab)
                answers[0] += correct
                answers[1] += total
            if self._answer_table is not None:
                guesses = baseline_predictions(x, self.vocab, self._answer_table)
                right, scored = answer_accuracy(x, y, guesses, self.vocab)
                self._baseline[0] += right
                self._baseline[1] += scored

    def on_validation_epoch_end(self) -> None:
        """Each live run's val/loss, val/bpc (= loss / ln 2), val/ppl (for ops val/answer_acc
        and its baseline), to its loggers and its `last_vals`."""
        if not self._val_batches:
            return
        # One transfer; the means in Python. Every rank evaluates the same fixed batches, so
        # no cross-rank reduction is needed.
        means = [total / self._val_batches for total in self._val_sum.tolist()]
        table = self.is_ops and self._answer_table is not None
        for index, mean_loss in enumerate(means):
            if self.live[index]:
                answers = self._answers[index] if self.is_ops else None
                metrics = val_metrics(mean_loss, answers, self._baseline if table else None)
                self.log_run(index, metrics, self.global_step)
                self.last_vals[index] = {"step": self.global_step, **metrics}
        if len(means) == 1:  # for ModelCheckpoint (a run's best.ckpt): callback_metrics only
            self.log(spec.VAL_LOSS, means[0], logger=False, prog_bar=False)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A checkpoint written under automatic optimization (before this module stepped
        itself) counts its steps there: carry the count over, so it resumes at its step."""
        loops = checkpoint.get("loops", {}).get("fit_loop", {})
        auto = loops.get("epoch_loop.automatic_optimization.optim_progress")
        manual = loops.get("epoch_loop.manual_optimization.optim_step_progress")
        if auto is None or manual is None or manual["total"]["completed"]:
            return
        loops["epoch_loop.manual_optimization.optim_step_progress"] = copy.deepcopy(
            auto["optimizer"]["step"]
        )


class LitCharModel(OneStep):
    """A CharTransformer trained on next-character prediction.

    `run_config` is `RunConfig.to_dict()` and `vocab_json` is `CharVocab.to_json()`: both
    plain, so the hyperparameters in a checkpoint load with `torch.load(weights_only=True)`.
    """

    def __init__(
        self,
        run_config: dict[str, Any],
        vocab_json: str | None = None,
        schedule_steps: int | None = None,
    ) -> None:
        super().__init__([run_config], vocab_json, schedule_steps)
        self.save_hyperparameters()
        self.config = self.configs[0]
        self.model = CharTransformer(self.config.model)
        # The steps call the model through torch.compile when asked (made in `setup`, for
        # the device the Trainer chose); probes and generation keep using the eager model,
        # which holds the very same parameters.
        self.compiled: CompiledModel | None = None
        self._restored_rng: dict[str, Any] | None = None  # a checkpoint's, for the next batch

    def setup(self, stage: str) -> None:
        """Compile the model for the steps when the config asks (once, whatever the stage)."""
        if self.config.train.compile and self.compiled is None:
            mode = compile_mode(self.trainer.strategy.root_device, self.trainer.world_size)
            self.compiled = CompiledModel(torch.compile(self.model, mode=mode))

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) and the loss when targets are given."""
        model = self.model if self.compiled is None else self.compiled.wrapper
        return model(idx, targets)

    def score(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (1, B, T, V) and loss (1,) of one evaluation batch: the one run's."""
        logits, loss = self.forward(x, y)
        return logits.unsqueeze(0), loss.reshape(1)

    def stack(self) -> RunStack:
        """The one run as a stack of one (views of the eager model's parameters)."""
        return RunStack.of(self.model)

    # -- training -------------------------------------------------------------------------

    def objective(
        self, batch: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Cross-entropy of next-character predictions on one batch, plus
        z_loss·mean((log Z)²) when z_loss > 0; {"loss": the objective, "ce": the
        cross-entropy} detached, as `callbacks.TrainingMonitor` logs it (the cross-entropy
        either way, so runs with and without z-loss share one scale).
        """
        x, y = batch  # (B, T), (B, T)
        logits, ce = self.forward(x, y)
        coefficient = self.config.train.z_loss
        if coefficient == 0:
            return ce, {"loss": ce.detach()}
        # PaLM's z-loss: pulls each position's log-normaliser log Z towards 0, so the
        # logits cannot drift upwards together (the softmax alone never notices a shift).
        log_z = logits.float().logsumexp(dim=-1)  # (B, T)
        loss = ce + coefficient * log_z.pow(2).mean()
        # "ce" is kept until it is logged: a copy, as a step compiled into CUDA graphs
        # returns outputs in memory that its next replay overwrites.
        return loss, {"loss": loss.detach(), "ce": ce.detach().clone()}

    def configure_gradient_clipping(self, optimizer: Any, *args: Any, **kwargs: Any) -> None:
        """Clip the global gradient norm to `grad_clip` (0: no clipping)."""
        if self.config.train.grad_clip:
            clip_norm_(optimizer, self.config.train.grad_clip)

    # -- optimisation ---------------------------------------------------------------------

    def configure_optimizers(self) -> dict[str, Any]:
        """AdamW (decay / no-decay groups) and a LambdaLR stepped after every update."""
        train = self.config.train
        # On a GPU the fused kernel: a few launches for all tensors where the for-each
        # implementation makes dozens and reads each tensor's step count on the host
        # (BENCHMARKS.md, "Solo step host work"). A CPU takes the for-each one, one call
        # per list where the per-tensor loop is Python per tensor: on a CPU its arithmetic
        # is the loop's, element for element (`tests/training/test_solo_step.py` holds a
        # run to the per-tensor loop's numbers). (A checkpoint's groups keep the flags.)
        fused = self.device.type == "cuda"
        optimizer = torch.optim.AdamW(
            param_groups(self.model, train.weight_decay),
            lr=train.lr,
            betas=(train.beta1, train.beta2),
            fused=fused or None,
            foreach=None if fused else True,
        )
        if fused:
            # A fused AdamW says it unscales 16-mixed gradients itself, and Lightning then
            # refuses gradient clipping. Unsaid, the GradScaler unscales before clipping
            # (and before the probes read the gradients) and steps it like any optimizer.
            optimizer._step_supports_amp_scaling = False

        def multiplier(step: int) -> float:
            return lr_at(step, train, self.schedule_steps) / train.lr

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}  # stepped by training_step

    # -- checkpoints ----------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the random state (dropout's masks) with the weights: a run resumed or
        forked from this checkpoint draws what the uninterrupted run would have drawn."""
        # The generator of the device this run trains on (rank 0's, the rank that writes
        # the file): every DDP rank seeded its own device's alike and draws alike, so each
        # restores it into its own device.
        on_cuda = self.device.type == "cuda"
        checkpoint[RNG_KEY] = {
            "cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(self.device) if on_cuda else None,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the random state a checkpoint carries (older ones carry none) for the first
        training batch: between the restore and that batch Lightning creates the training
        loader's iterator, which draws a seed from the global generator."""
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get(RNG_KEY)
        self._restored_rng = state if isinstance(state, dict) else None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """The first batch after a restore starts from the random state the checkpoint had."""
        state, self._restored_rng = self._restored_rng, None
        if state is None:
            return
        cpu = state.get("cpu")
        if isinstance(cpu, torch.Tensor):
            torch.set_rng_state(cpu)
        cuda = state.get("cuda")
        if isinstance(cuda, torch.Tensor) and self.device.type == "cuda":
            torch.cuda.set_rng_state(cuda, self.device)

    # -- generation -----------------------------------------------------------------------

    def generate_all(self, prompt: str, **sampling: Any) -> list[str | None]:
        """`generate` as every run's text (this module's one); None where the logits are
        not finite (a diverged model has nothing to say)."""
        try:
            return [self.generate(prompt, **sampling)]
        except NonFiniteLogits:
            return [None]

    @torch.inference_mode()
    def generate(
        self,
        prompt: str,
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> str:
        """The text sampled after `prompt` (the prompt itself not included).

        Characters the vocabulary lacks are replaced; an empty prompt starts from a newline
        (or the first symbol). A `seed` makes the sample reproducible without touching the
        global random state that training uses.
        """
        if self.vocab is None:
            raise ModelInputError("this model has no vocabulary; build it with vocab_json")
        context = prompt_ids(self.vocab, prompt, self.config.model.block_size, self.device)
        was_training = self.model.training
        self.model.eval()
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=cuda, enabled=seed is not None):
                if seed is not None:
                    torch.manual_seed(seed)
                out = self.model.generate(context, max_new_tokens, temperature, top_k)  # (1, T+N)
        finally:
            self.model.train(was_training)
        return self.vocab.decode(out[0, context.size(1) :])
