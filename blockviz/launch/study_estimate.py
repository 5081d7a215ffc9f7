"""A study's time on this machine, from the pace its store's completed runs measured.

Each of the store's newest completed runs (not a fork or replay: those train part of their
steps) gives its seconds per training step, evaluations and probes included: its final
`time_s` over its steps, a replica's batch time shared by the K runs of its batch. A
study's run takes the median pace of the measured runs of its own shape (the same model
FLOPs per step); a shape nobody measured takes the pace of the measured shape nearest to it,
scaled by the FLOPs per step. The workers then claim the study's runs as they will (the
store's `batch_to_claim`: batches of replicas within each worker's share), each worker as
soon as it is free; a batch takes as long as its members one after another (what a CPU
does, and what the measured pace of a replica says elsewhere). With nothing measured, a
reference speed gives a rough guess, and the text says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from statistics import median

from blockviz.core import hardware, replicas
from blockviz.core.config import RunConfig
from blockviz.core.config_model import ModelConfig
from blockviz.core.fields import ConfigError
from blockviz.core.params import param_count
from blockviz.core.studies.define import StudyDef
from blockviz.launch import runner
from blockviz.store import RunStore
from blockviz.store.studies import batch_to_claim

MEASURED_RUNS = 50  # the store's newest runs a pace is read from
# The rough guess's speed while nothing is measured: model FLOPs per second (6 · parameters ·
# tokens / s) of one run, the median of the quick lr-sensitivity runs on the 2-core
# development box, two at once with one thread each (BENCHMARKS.md, "Studies that answer").
DEFAULT_FLOPS_PER_S = 3.5e10
PER_RUN_OVERHEAD_S = 0.5  # model, Trainer and data set-up of each run inside a worker
WORKER_START_S = 6.0  # a worker's imports (torch, Lightning) before its first run
INIT_MODEL_S = 0.3  # one model of the init-gradients study: build, forward, backward
SAME_SHAPE = 1e-9  # relative difference of FLOPs per step below which two shapes are one


def step_flops(config: RunConfig) -> float:
    """A training step's model FLOPs, 6 · parameters · tokens of one batch, at the default
    vocabulary size: a run's stored config (its dataset's vocabulary) and a study's planned
    one (the data not read yet) then compare."""
    model = dataclasses.replace(config.model, vocab_size=ModelConfig.vocab_size)
    return 6.0 * param_count(model) * config.train.batch_size * config.model.block_size


@dataclass(frozen=True)
class Pace:
    """Measured seconds per training step of each shape (keyed by FLOPs per step), and how
    many completed runs they rest on; empty when the store measured nothing."""

    step_s: dict[float, float] = field(default_factory=dict)
    runs: int = 0

    def seconds_per_step(self, flops: float) -> float:
        """A step of `flops`: its own shape's pace, else the nearest shape's scaled, else
        the reference speed."""
        if not self.step_s:
            return flops / DEFAULT_FLOPS_PER_S
        nearest = min(self.step_s, key=lambda measured: abs(math.log(measured / flops)))
        return self.step_s[nearest] * flops / nearest

    def measured(self, flops: float) -> bool:
        """Whether a run of this shape was measured (no scaling)."""
        return any(abs(m - flops) <= SAME_SHAPE * flops for m in self.step_s)


def measured_pace(store: RunStore | None) -> Pace:
    """This machine's pace from the store's newest completed runs (see the module doc)."""
    if store is None:
        return Pace()
    paces: dict[float, list[float]] = {}
    for run in store.runs_frame().tail(MEASURED_RUNS).itertuples():
        if run.status != "completed":
            continue
        record = store.get_run(int(run.id))
        seconds = (record.final or {}).get("time_s")
        steps = record.step
        if record.fork_step is not None or not isinstance(seconds, int | float) or not steps:
            continue
        try:
            config = RunConfig.from_dict(record.config or {})
        except (ConfigError, TypeError, ValueError):
            continue
        batch = replicas.read_batch_file(store.run_dir(int(run.id)))
        members = len(batch["runs"]) if batch else 1
        if math.isfinite(seconds) and seconds > 0:
            paces.setdefault(step_flops(config), []).append(seconds / members / int(steps))
    measured = sum(len(each) for each in paces.values())
    return Pace({flops: median(each) for flops, each in paces.items()}, measured)


def estimate_s(
    study: StudyDef, pace: Pace, workers: int, replica_limit: int | None = None
) -> float:
    """Seconds a study should take here: its runs at the measured pace, claimed by `workers`
    as they will claim them (each as soon as it is free), after the workers start."""
    if not study.trains:  # one forward and backward pass per model, Pre-LN and Post-LN
        return WORKER_START_S + INIT_MODEL_S * 2 * len(study.variants) * len(study.seeds)
    try:
        configs = [config for _, _, config in study.grid()]
    except ConfigError:
        return math.nan
    run_s = [
        c.train.max_steps * pace.seconds_per_step(step_flops(c)) + PER_RUN_OVERHEAD_S
        for c in configs
    ]
    limit = replicas.default_replicas() if replica_limit is None else replica_limit
    texts = [config.to_json() for config in configs]
    unclaimed = list(range(len(configs)))
    busy_until = [0.0] * max(1, workers)
    while unclaimed:
        worker = busy_until.index(min(busy_until))
        rows = [(index, texts[index]) for index in unclaimed]
        batch = batch_to_claim(rows, max(1, limit), replicas.stored_batch_key, len(busy_until))
        busy_until[worker] += sum(run_s[index] for index in batch)
        unclaimed = [index for index in unclaimed if index not in batch]
    return WORKER_START_S + max(busy_until)


def estimate_assumes(
    study: StudyDef,
    workers: int,
    max_running: int | None = None,
    threads: int | None = None,
    pace: Pace | None = None,
) -> str:
    """What a study's time estimate rests on: the pace (measured, or a rough guess),
    workers, threads per run, and that the study has the store's run slots to itself."""
    pace = pace or Pace()
    slots = runner.default_max_running() if max_running is None else max_running
    where = f" ({hardware.slots_source()})" if max_running is None else ""
    each = threads or hardware.share_of_cores(slots)
    if pace.runs:
        try:
            shapes = [step_flops(config) for _, _, config in study.grid()]
        except ConfigError:
            shapes = []
        own = sum(pace.measured(flops) for flops in shapes)
        source = (
            f"the pace this store's last {pace.runs} completed run(s) measured here (seconds "
            f"a step, evaluations included); {own} of its {len(shapes)} runs have a measured "
            "run of their shape"
        ) + (
            "" if own == len(shapes) else ", the others are scaled by FLOPs a step from the nearest"
        )
    else:
        source = (
            f"a rough guess: no completed run in this store measured this machine yet, so a "
            f"reference speed of {DEFAULT_FLOPS_PER_S:.2g} model FLOP/s a run (a 2-core CPU)"
        )
    return (
        f"from {source}; {workers} worker(s) at once, {hardware.threads_text(each)} each, "
        f"and no other run training here meanwhile: {slots} run(s) may train at once{where}, "
        "and a study's run waits for a free slot"
    )
