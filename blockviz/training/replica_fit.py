"""One fit of a batch of replicas: the Trainer around `LitReplicas`, and each replica's
monitoring done by the very callbacks a solo run uses.

The Trainer's one `TrainingMonitor` logs every replica's train/* scalars to its own
loggers (its losses are a column of the batch's one transfer per logged step), and each
replica's `BlockProbe` (per-layer statistics, attention, samples) measures the replica's
own `LitCharModel` (whose parameters are views into the stack), called by `ReplicaProbes`.
So a replica's rows are the rows its solo run writes. The probe steps of all replicas
reach the host in one transfer per probe step: the host work of an ordinary step does not
grow with the number of replicas.

A replica that diverges is recorded at once (status, step, final metrics) by `on_diverged`
and masked out; the others go on. When none is left the fit ends.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from blockviz.core import config as cfg
from blockviz.core.plans import Plan
from blockviz.store import RunStore
from blockviz.training.callbacks import ConsoleProgress, TrainingMonitor
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
    probe: BlockProbe | None = None
    heartbeat: Heartbeat | None = None
    outcome: Outcome | None = None  # set when it diverges (the others when the fit ends)


class ReplicaProbes(Callback):
    """Drives each live replica's BlockProbe, on the replica's own `LitCharModel` (its
    parameters views into the stack), as a solo fit drives its probe."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self._probed = False  # this step's probes measured something to write

    def _live(self, lit: LitReplicas) -> list[Replica]:
        return [r for r in self.replicas if lit.live[r.index] and r.probe is not None]

    def on_fit_start(self, trainer: L.Trainer, pl_module: LitReplicas) -> None:
        """Make the views; start each replica's probe as a solo fit would."""
        views = pl_module.make_views()
        for replica in self.replicas:
            if replica.outcome is not None:  # finished before this session: masked out
                pl_module.mask(replica.index)
        for replica in self._live(pl_module):
            replica.probe.on_fit_start(trainer, views[replica.index])

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
        live = self._live(pl_module)
        with self._samples(pl_module, live, step if probe.is_sample_step(step) else None):
            for replica in live:
                pl_module.share_grads(replica.index)
                replica.probe.on_before_optimizer_step(
                    trainer, pl_module.views[replica.index], optimizer
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
        """The probes' records of this step, every replica's in one transfer."""
        if not self._probed:
            return
        self._probed = False
        pending = [(r, r.probe.take_pending()) for r in self._live(pl_module)]
        pending = [(r, p) for r, p in pending if p is not None]
        hosts = to_host([p for _, p in pending])
        for (replica, item), host in zip(pending, hosts, strict=True):
            replica.probe.write_host(item, host)

    def on_train_end(self, trainer: L.Trainer, pl_module: LitReplicas) -> None:
        """The last sample and attention map of each live replica."""
        live = self._live(pl_module)
        probe = self._probe()
        step = trainer.global_step
        sample = probe is not None and not probe.sampled_at(step)
        with self._samples(pl_module, live, step if sample else None):
            for replica in live:
                replica.probe.on_train_end(trainer, pl_module.views[replica.index])


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
    """A Replica per member: its store logger (and --logger files) and probe; a member
    that does not train has its outcome already."""
    replicas = []
    for index, (member, run_id, run_dir) in enumerate(
        zip(plan.members, run_ids, run_dirs, strict=True)
    ):
        replica = Replica(index, run_id, member.config)
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

    def on_diverged(index: int, step: int) -> None:
        replica = replicas[index]
        lit.mark_diverged(index, step)
        replica.outcome = Outcome("diverged", step)
        replica.heartbeat.stop()  # its row is final: no more beats, no more steps
        record(index, replica.outcome, lit.views[index], trainer)

    probes = ReplicaProbes(replicas)
    monitor = TrainingMonitor(shared.train.log_interval, runs=lit.k, on_diverged=on_diverged)
    callbacks = [lifecycle, probes, *([ConsoleProgress()] if progress else []), monitor]
    trainer = make_trainer(shared, callbacks, None, plan.batch_dir, replicas=True)
    for replica in replicas:
        lit.replica_loggers[replica.index] = replica.loggers
    on_ready(trainer, lit.views)
    training = [r for r in replicas if r.outcome is None]
    for replica in training:
        replica.heartbeat.step = plan.start_step
        replica.heartbeat.start()

    def scored(step: int) -> bool:
        live = [view for view, alive in zip(lit.views, lit.live, strict=True) if alive]
        return all(view.last_val.get("step") == step for view in live)

    def finish() -> None:  # the end's sample and attention map (Lightning skipped them)
        probes.on_train_end(trainer, lit)

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
            record(replica.index, outcome, lit.views[replica.index], trainer)
