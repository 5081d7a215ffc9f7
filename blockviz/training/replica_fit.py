"""One fit of a batch of replicas: the Trainer around `LitReplicas`, and each replica's
monitoring done by the very callbacks a solo run uses.

Each replica gets its own `TrainingMonitor` (train/* scalars, divergence) and `BlockProbe`
(per-layer statistics, attention, samples), called by `ReplicaCallbacks` with a view of the
Trainer (`ReplicaTrainer`: that replica's loggers, lr and monitor) and the replica's own
`LitCharModel` (whose parameters are views into the stack). So a replica's rows are the rows
its solo run writes. Every replica's losses reach the host in one transfer per logged
step, and the probe steps of all replicas in one transfer per probe step: the host work of
an ordinary step does not grow with the number of replicas.

A replica that diverges is recorded at once (status, step, final metrics) by `on_diverged`
and masked out; the others go on. When none is left the fit ends.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from blockviz.core import config as cfg
from blockviz.core.plans import Plan
from blockviz.store import RunStore
from blockviz.training.callbacks import HostCopies, TrainingDiverged, TrainingMonitor, read_host
from blockviz.training.fit import Outcome, Record, fit_loop, sample_prompt, watchers
from blockviz.training.lifecycle import Heartbeat, StopRequest
from blockviz.training.logger import RunLifecycle
from blockviz.training.model import NonFiniteLogits
from blockviz.training.probes import BlockProbe, to_host
from blockviz.training.replicas import LitReplicas
from blockviz.training.trainer import make_trainer

log = logging.getLogger(__name__)


@dataclass
class Replica:
    """One replica of a batch: its run, its config and what watches it."""

    index: int
    run_id: int
    config: cfg.RunConfig
    loggers: list[Any] = field(default_factory=list)
    monitor: TrainingMonitor | None = None
    probe: BlockProbe | None = None
    heartbeat: Heartbeat | None = None
    outcome: Outcome | None = None  # set when it diverges (the others when the fit ends)


class _LrView:
    """`optimizers[0].param_groups[0]["lr"]` as a replica's monitor reads it."""

    def __init__(self, lr: float) -> None:
        self.param_groups = [{"lr": lr}]


class ReplicaTrainer:
    """The Trainer as one replica's callbacks see it: its loggers, lr and monitor; the
    rest (step, device, precision, data, strategy) is the batch's."""

    def __init__(self, trainer: L.Trainer, lit: LitReplicas, replica: Replica) -> None:
        self._trainer = trainer
        self._lit = lit
        self._replica = replica

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)

    @property
    def loggers(self) -> list[Any]:
        """This replica's loggers (its store rows, its TensorBoard / CSV files)."""
        return self._replica.loggers

    @property
    def optimizers(self) -> list[_LrView]:
        """The lr this replica's next update uses."""
        return [_LrView(self._lit.lr_of(self._trainer.global_step)[self._replica.index])]

    @property
    def callbacks(self) -> list[Any]:
        """Its monitor (what `final_metrics` looks for)."""
        return [self._replica.monitor]


class _Window(NamedTuple):
    """A logged window of every replica's losses, on its way to the host."""

    steps: list[int]
    values: torch.Tensor  # (steps, K) float32: on the host once `ready`, or on a CPU
    ready: Any  # the CUDA event recorded after the copy (None: nothing to wait for)
    ticks: dict[int, Any]  # each live replica's monitor's clock when the window closed
    lrs: list[float]  # each replica's lr at the window's last step


class ReplicaCallbacks(Callback):
    """Drives each live replica's TrainingMonitor and BlockProbe; masks out the diverged.

    `on_diverged(replica, step)` records a replica that diverged; a fit with no live
    replica left ends (TrainingDiverged of the last one).
    """

    # Read a logged window's losses at the next logged step (None: on a GPU), as
    # TrainingMonitor reads a solo run's: no step waits for the device.
    defer: bool | None = None

    def __init__(
        self,
        replicas: list[Replica],
        on_diverged: Callable[[Replica, int], None],
        progress: bool = False,
    ) -> None:
        self.replicas = replicas
        self.on_diverged = on_diverged
        self.progress = progress
        self._views: list[ReplicaTrainer] = []
        self._losses: list[Any] = []  # each step's (K,) losses, on the device
        self._steps: list[int] = []
        self._step = 0
        self._probed = False  # this step's probes measured something to write
        self._in_flight: _Window | None = None  # a logged window's losses on their way
        self._copies: HostCopies | None = None  # pinned buffers (a GPU's batch)
        self._validated = False  # a validation paused the monitors' clocks

    def _live(self, lit: LitReplicas) -> list[Replica]:
        return [r for r in self.replicas if lit.live[r.index]]

    def on_fit_start(self, trainer: L.Trainer, pl_module: LitReplicas) -> None:
        """Make the views; start each replica's probe as a solo fit would."""
        views = pl_module.make_views()
        for replica in self.replicas:
            if replica.outcome is not None:  # finished before this session: masked out
                pl_module.mask(replica.index)
        self._views = [ReplicaTrainer(trainer, pl_module, r) for r in self.replicas]
        for replica in self._live(pl_module):
            if replica.probe is not None:
                replica.probe.on_fit_start(self._views[replica.index], views[replica.index])

    def on_train_start(self, trainer: L.Trainer, pl_module: LitReplicas) -> None:
        """Start each monitor's clocks."""
        for replica in self.replicas:
            replica.monitor.on_train_start(self._views[replica.index], pl_module)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: LitReplicas, batch: Any, batch_idx: int
    ) -> None:
        """Note the step; after a validation, restart the monitors' throughput clocks."""
        self._step = trainer.global_step
        if self._validated:
            for replica in self.replicas:
                replica.monitor.resume_clock()
            self._validated = False

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: LitReplicas, optimizer: Any
    ) -> None:
        """At probe and sample steps (and only then), each live replica's probe measures its
        slice (gradients shared as views); the text samples of all of them in one pass."""
        probe = self._probe()
        step = trainer.global_step
        if probe is None or not (probe.is_probe_step(step) or probe.is_sample_step(step)):
            return
        self._probed = True
        live = [r for r in self._live(pl_module) if r.probe is not None]
        with self._samples(pl_module, live, step if probe.is_sample_step(step) else None):
            for replica in live:
                pl_module.share_grads(replica.index)
                replica.probe.on_before_optimizer_step(
                    self._views[replica.index], pl_module.views[replica.index], optimizer
                )

    def _probe(self) -> BlockProbe | None:
        """One replica's probe: the cadence and sampling settings every replica shares."""
        return next((r.probe for r in self.replicas if r.probe is not None), None)

    @contextlib.contextmanager
    def _samples(self, lit: LitReplicas, replicas: list[Replica], step: int | None) -> Any:
        """While the probes run: each replica's view answers `generate` with its text from
        one stacked sampling pass (seeded with `step`); nothing when `step` is None."""
        probe = self._probe()
        if step is None or probe is None or lit.vocab is None:
            yield
            return
        texts = lit.generate_all(
            probe.prompt, probe.sample_chars, probe.temperature, probe.top_k, step
        )
        views = [lit.views[r.index] for r in replicas]
        for view, replica in zip(views, replicas, strict=True):
            view.generate = functools.partial(_sampled, texts[replica.index])
        try:
            yield
        finally:
            for view in views:
                del view.generate

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: LitReplicas, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """The probes' records in one transfer, then each monitor's loss (and divergence)."""
        if self._probed:
            self._probed = False
            live = self._live(pl_module)
            pending = [(r, r.probe.take_pending()) for r in live if r.probe is not None]
            pending = [(r, p) for r, p in pending if p is not None]
            hosts = to_host([p for _, p in pending])
            for (replica, item), host in zip(pending, hosts, strict=True):
                replica.probe.write_host(item, host)
        step = self._step
        self._losses.append(outputs["ce"])  # (K,) on the device
        self._steps.append(step)
        if not self.replicas[0].monitor.due(step, trainer.max_steps):
            return
        values = torch.stack(self._losses).float()  # (steps, K)
        steps = list(self._steps)
        self._losses.clear()
        self._steps.clear()
        tokens = batch[0][0].numel()  # one replica's batch
        ticks = {
            r.index: r.monitor.tick(self._views[r.index], len(steps), tokens)
            for r in self._live(pl_module)
        }
        ready = None
        if values.is_cuda:  # on its way to the host while the next steps train
            if self._copies is None or self._copies.size < values.numel():
                self._copies = HostCopies(values.numel())
            host, ready = self._copies.send(values.flatten())
            values = host.view(values.shape)
        window = _Window(steps, values, ready, ticks, pl_module.lr_of(step))
        self.drain(trainer, pl_module)  # the window before: arrived long ago
        defer = self.defer if self.defer is not None else ready is not None
        if defer and step + 1 < trainer.max_steps:
            self._in_flight = window
        else:
            self._log(trainer, pl_module, window)

    def drain(self, trainer: L.Trainer, pl_module: LitReplicas) -> None:
        """Log the losses still on their way to the host (if any)."""
        window, self._in_flight = self._in_flight, None
        if window is not None:
            self._log(trainer, pl_module, window)

    def _log(self, trainer: L.Trainer, pl_module: LitReplicas, window: _Window) -> None:
        """Every live replica's rows of one window (one wait for the transfer); a replica
        whose loss is not finite is recorded diverged and masked out."""
        rows = read_host(window.values, window.ready)  # (steps, K) as lists
        diverged: list[tuple[Replica, int]] = []
        for replica in self._live(pl_module):
            tick = window.ticks.get(replica.index)
            if tick is None:
                continue
            column = [row[replica.index] for row in rows]
            try:
                replica.monitor.record(
                    self._views[replica.index],
                    window.steps,
                    column,
                    window.lrs[replica.index],
                    tick,
                )
            except TrainingDiverged as exc:
                diverged.append((replica, exc.step))
        for replica, step in diverged:
            pl_module.mark_diverged(replica.index, step)
            self.on_diverged(replica, step)
        if self.progress:
            self._print(trainer, pl_module)
        if diverged and not any(pl_module.live):
            replica, step = diverged[-1]
            raise TrainingDiverged(step, float("nan"))

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: LitReplicas, checkpoint: dict[str, Any]
    ) -> None:
        """The losses in flight reach the store before the checkpoint holds its rows."""
        self.drain(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: LitReplicas, exception: Any) -> None:
        """A stop or a failure: log the losses in flight."""
        with contextlib.suppress(TrainingDiverged):
            self.drain(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: LitReplicas) -> None:
        """Pause the monitors' throughput clocks; log the losses in flight."""
        self.drain(trainer, pl_module)
        self._validated = True
        for replica in self.replicas:
            replica.monitor.on_validation_start(self._views[replica.index], pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: LitReplicas) -> None:
        """Stop the clocks; the last sample and attention map of each live replica."""
        self.drain(trainer, pl_module)
        for replica in self.replicas:
            replica.monitor.on_train_end(self._views[replica.index], pl_module)
        live = [r for r in self._live(pl_module) if r.probe is not None]
        probe = self._probe()
        step = trainer.global_step
        sample = probe is not None and not probe.sampled_at(step)
        with self._samples(pl_module, live, step if sample else None):
            for replica in live:
                replica.probe.on_train_end(
                    self._views[replica.index], pl_module.views[replica.index]
                )

    def _print(self, trainer: L.Trainer, pl_module: LitReplicas) -> None:
        step, total = trainer.global_step, trainer.max_steps
        if step % max(10, total // 20) and step < total:
            return
        losses = []
        for replica in self.replicas:
            last = replica.monitor.last_train.get("loss")
            losses.append("—" if last is None or replica.outcome else f"{last:.4f}")
        print(f"step {step}/{total} | losses {' '.join(losses)}", file=sys.stderr, flush=True)


def _sampled(text: str | None, *args: Any, **kwargs: Any) -> str:
    """A replica's text from the batch's sampling pass, as its `generate` would give it."""
    if text is None:
        raise NonFiniteLogits("the model's next-character logits are not finite")
    return text


class BatchLifecycle(RunLifecycle):
    """RunLifecycle for a batch: every replica's heartbeat, and each one's rows carried in
    the batch's checkpoint under its run id."""

    def __init__(self, stop: StopRequest, replicas: list[Replica], store: RunStore) -> None:
        super().__init__(stop, [r.heartbeat for r in replicas if r.heartbeat is not None], store)
        self.replicas = replicas

    def pending_rows(self) -> dict[str, Any]:
        """Each replica's rows the store has not taken yet, by run id."""
        return {str(r.run_id): self.store.buffered_rows(r.run_id) for r in self.replicas}


def build_replicas(
    plan: Plan, run_ids: list[int], store: RunStore, run_dirs: list[Path], prompt: str
) -> list[Replica]:
    """A Replica per member: its store logger (and --logger files), monitor and probe; a
    member that does not train has only its monitor, and its outcome already."""
    replicas = []
    for index, (member, run_id, run_dir) in enumerate(
        zip(plan.members, run_ids, run_dirs, strict=True)
    ):
        monitor = TrainingMonitor(member.config.train.log_interval)
        replica = Replica(index, run_id, member.config, monitor=monitor)
        replicas.append(replica)
        if member.finished:
            replica.outcome = Outcome("skipped", plan.start_step)
            continue
        replica.loggers, replica.probe = watchers(
            plan, member.config, store, run_id, run_dir, prompt
        )
        replica.heartbeat = Heartbeat(store, run_id)
    return replicas


def fit_replicas(
    plan: Plan,
    datamodule: Any,
    run_dirs: list[Path],
    run_ids: list[int],
    store: RunStore,
    stop: StopRequest,
    progress: bool,
    on_ready: Callable[[Any, list[Any]], None],
    record: Record,
) -> None:
    """A plan of K members: one `LitReplicas` fit in the batch's folder, each member's end
    handed to `record` (a diverged one at once, the others when the fit ends)."""
    configs = [member.config.to_dict() for member in plan.members]
    lit = LitReplicas(configs, datamodule.vocab.to_json(), plan.schedule_steps)
    replicas = build_replicas(plan, run_ids, store, run_dirs, sample_prompt(datamodule))
    shared = cfg.replace(plan.config, grad_clip=0.0)  # clipping is per replica (lit)
    lifecycle = BatchLifecycle(stop, replicas, store)

    def on_diverged(replica: Replica, step: int) -> None:
        replica.outcome = Outcome("diverged", step)
        replica.heartbeat.stop()  # its row is final: no more beats, no more steps
        view = ReplicaTrainer(trainer, lit, replica)
        record(replica.index, replica.outcome, lit.views[replica.index], view)

    fan = ReplicaCallbacks(replicas, on_diverged, progress)
    trainer = make_trainer(shared, [lifecycle, fan], None, plan.batch_dir, replicas=True)
    for replica in replicas:
        lit.replica_loggers[replica.index] = replica.loggers
    on_ready(trainer, lit.views)
    training = [r for r in replicas if r.outcome is None]
    for replica in training:
        replica.heartbeat.step = plan.start_step
        replica.heartbeat.start()

    def live() -> list[Replica]:
        return [r for r in replicas if lit.live[r.index]]

    def scored(step: int) -> bool:
        return all(lit.views[r.index].last_val.get("step") == step for r in live())

    def finish() -> None:  # the end's sample and attention map (Lightning skipped them)
        fan.on_train_end(trainer, lit)

    try:
        outcome = fit_loop(trainer, lit, datamodule, plan, stop, lifecycle, scored, finish)
    finally:
        for replica in training:
            replica.heartbeat.stop()
        # Each replica's --logger files: not the Trainer's loggers, so closed here (a csv
        # writer keeps rows until it saves; a TensorBoard writer holds a file and a thread).
        for replica in replicas:
            for logger in replica.loggers[1:]:
                try:
                    logger.finalize("success")
                except Exception as exc:  # a logger that cannot write never fails the run
                    log.warning("closing a logger of run %s: %s", replica.run_id, exc)
    if outcome.status == "diverged":  # the last live one diverged (recorded): none is left
        outcome = Outcome("stopped", outcome.step)
    for replica in replicas:
        if replica.outcome is None:
            replica.outcome = outcome
            view = ReplicaTrainer(trainer, lit, replica)
            record(replica.index, outcome, lit.views[replica.index], view)
