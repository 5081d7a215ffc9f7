"""What a training command is about to train, as a value (torch-free): a `Plan` of one run
or of K replicas (its members), each with its config and run, and the checkpoint they
continue from; `plan_seeds` (one new run per seed, in batches) and the rules of a resume's
overrides and lr horizon. Plans that read the store or a checkpoint are made in
`training.plan`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blockviz.core import config as cfg
from blockviz.core import replicas
from blockviz.core.flags import UsageError, build_config, coerce_fields
from blockviz.core.naming import run_name
from blockviz.core.requests import TrainRequest

# Fields a resumed run may change: hardware and cadence, never the maths.
RESUMABLE_FIELDS = tuple(name for name, spec in cfg.FIELDS.items() if spec.resume)

Rows = Mapping[str, list[list[Any]]]


@dataclass(frozen=True)
class Member:
    """One run of a plan: its config, name and run (None: create it)."""

    config: cfg.RunConfig
    name: str
    run_id: int | None = None
    # In a batch's checkpoint but not training on (it finished, diverged, or is gone):
    # masked out, never registered nor recorded.
    finished: bool = False
    pending_rows: Rows | None = None  # rows the checkpoint carried for it


@dataclass(frozen=True)
class Fork:
    """A fork or replay (training.fork): a new run from `parent_id`'s checkpoint."""

    parent_id: int
    kind: str
    info: Mapping[str, Any]


@dataclass(frozen=True)
class Plan:
    """What is about to train: one run, or K replicas of one batched model, and from which
    checkpoint. Never changed: a new value (`dataclasses.replace`) where one differs."""

    members: tuple[Member, ...]
    checkpoint: Path | None = None  # resume from here
    start_step: int = 0
    schedule_steps: int | None = None  # where the lr decay ends (None: max_steps)
    # A run recorded before the evaluation set keeps scoring on its seed's windows.
    legacy_eval: bool = False
    fork: Fork | None = None
    # Where a resumed batch keeps its checkpoints (a new batch gets its own folder).
    batch_dir: Path | None = None
    checkpoint_note: str | None = None  # why a resume starts from another checkpoint

    @property
    def config(self) -> cfg.RunConfig:
        """The first member's config (what a batch's members share)."""
        return self.members[0].config

    @property
    def batch(self) -> bool:
        """Whether this trains replicas of one batched model (more than one member)."""
        return len(self.members) > 1

    @property
    def finishing(self) -> bool:
        """A resume whose checkpoint is at max_steps (killed after writing it): no step
        left to train, only what the end of a run writes."""
        return self.checkpoint is not None and self.start_step >= self.config.train.max_steps

    def start_text(self) -> str:
        """What the plan's runs are about to do, as its first line says it: `run 3 (name)
        started`, `runs 4, 5 (2 replicas of one batch) resuming from step 200`, ..."""
        verb = f"resuming from step {self.start_step}" if self.checkpoint else "started"
        if self.checkpoint_note:
            verb += f" ({self.checkpoint_note})"
        if self.fork is not None:
            verb = f"{self.fork.kind} of run {self.fork.parent_id} from step {self.start_step}"
        if self.finishing:
            at = self.start_step
            verb = f"finishing: its last checkpoint is at max_steps ({at}), no step to train"
        training = [m for m in self.members if not m.finished]
        if self.batch:
            runs = ", ".join(str(m.run_id) for m in training)
            return f"runs {runs} ({len(training)} replicas of one batch) {verb}"
        return f"run {training[0].run_id} ({training[0].name}) {verb}"

    def horizon_note(self) -> str | None:
        """What a resume past the first max_steps does to a decaying lr schedule (None:
        nothing to say)."""
        first, schedule = self.config.train.max_steps, self.config.train.lr_schedule
        if not self.schedule_steps or self.schedule_steps == first or schedule == "constant":
            return None
        return (
            f"the {schedule} lr schedule keeps its horizon of {self.schedule_steps} steps: "
            "lr reaches min_lr there and stays at it"
        )

    def with_vocab(self, size: int) -> Plan:
        """The plan with every config holding the vocabulary's size."""
        members = tuple(
            dataclasses.replace(m, config=cfg.replace(m.config, vocab_size=size).validate())
            for m in self.members
        )
        return dataclasses.replace(self, members=members)


def plan_seeds(request: TrainRequest) -> list[Plan]:
    """`train --seeds`: one new run per seed, in batches of at most `--replicas` (a seed
    alone is exactly the solo `train --seed SEED --name NAME-sSEED`)."""
    base = build_config(request.source)
    name = request.name or run_name(base, request.preset)
    limit = request.replicas
    reason = replicas.why_solo(base)
    if reason is not None:
        limit = 1
        print(f"blockviz: these seeds train one after another: {reason}", flush=True)
    seeds = request.seeds or ()
    members = [Member(cfg.replace(base, seed=s).validate(), f"{name}-s{s}") for s in seeds]
    groups = replicas.group([(m, m.config) for m in members], limit)
    return [Plan(tuple(group)) for group in groups]


def schedule_horizon(state: dict[str, Any], config: cfg.RunConfig) -> int:
    """Where the lr decay of a resumed run ends: the horizon `read_checkpoint`'s `state`
    carries (the run's first max_steps), not a larger --max_steps given to the resume.

    Every rank of a DDP run must use it: DDP averages the gradients, not the updates, so
    ranks on different schedules would drift apart.
    """
    hparams = state["hyper_parameters"]
    first = hparams.get("run_config") or (hparams.get("run_configs") or [None])[0]  # a batch's
    first_max_steps = ((first or {}).get("train") or {}).get("max_steps")
    return int(hparams.get("schedule_steps") or first_max_steps or config.train.max_steps)


def resume_overrides(fields: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The config fields a resume was given; UsageError when one may not change."""
    overrides = coerce_fields(fields, list(cfg.SECTIONS))
    changed = sorted(set(overrides) - set(RESUMABLE_FIELDS))
    if changed:
        raise UsageError(
            f"--{changed[0]} cannot change on --resume (the run's maths is fixed); "
            f"allowed: {', '.join('--' + f for f in RESUMABLE_FIELDS)}"
        )
    return overrides
