"""What a training command asks for, parsed once at the edge (`blockviz.cli`) into frozen
values: the training side reads these, never the command line.

Config flags travel as the texts given (`ConfigSource`): they become a RunConfig where a
run is planned (`core.flags.build_config`), so a bad value given for a run the runner
created (`--run_id`) fails that run with the field's own message.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigSource:
    """Where a run's config comes from: a preset or a JSON file, then field flags (their
    texts, by field name) on top."""

    preset: str | None = None
    file: str | None = None
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Session:
    """How a training process trains: into which store, how many runs at once, with how
    many CPU threads, with or without a progress line."""

    store: str | None = None
    max_running: int = 0
    threads: int | None = None
    progress: bool = False


@dataclass(frozen=True)
class TrainRequest:
    """`train`: a new run (`source`), seeds of one (`seeds`), the runner's queued run
    (`run_id`), or a resume of a run or of its batch (`resume`)."""

    session: Session
    source: ConfigSource = ConfigSource()
    name: str | None = None
    preset: str | None = None  # names a new run (run_name), with its config
    resume: str | None = None  # a run's id or name
    run_id: int | None = None
    seeds: tuple[int, ...] | None = None
    replicas: int = 1  # the most seeds one batch holds (`--replicas`, read with `seeds`)


@dataclass(frozen=True)
class ForkRequest:
    """`fork RUN --step N`: a twin of RUN from its kept checkpoint at N, changed in
    `fields` (texts, by field name)."""

    session: Session
    run: str
    step: int
    fields: tuple[tuple[str, str], ...] = ()
    name: str | None = None


@dataclass(frozen=True)
class ReplayRequest:
    """`replay RUN`: the steps before RUN's event (`around`, else its divergence or
    largest spike) again, `after` steps past it, probed every step."""

    session: Session
    run: str
    around: int | None = None
    after: int = 10
    name: str | None = None


@dataclass(frozen=True)
class WorkRequest:
    """`study work STUDY`: a worker that trains a study's runs, `replicas` at most at once."""

    store: str
    study: int
    max_running: int = 0
    threads: int | None = None
    replicas: int = 1  # the most runs one batch holds


@dataclass(frozen=True)
class InitGradsRequest:
    """`init-grads`: the gradient at initialization over depths, inits and seeds 0..N-1."""

    source: ConfigSource
    depths: tuple[int, ...]
    inits: tuple[str, ...]
    seeds: int
    threads: int = 1
    json: bool = False
    quiet: bool = False
