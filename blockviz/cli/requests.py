"""The training commands' flags, read once into the frozen requests (`core.requests`) the
training side takes: `train`, `fork`, `replay` and `study work`. A bad value is a
UsageError here, before anything is loaded or recorded.
"""

from __future__ import annotations

import argparse

from blockviz.core import replicas
from blockviz.core.corpora import check_dataset
from blockviz.core.flags import (
    UsageError,
    build_config,
    check_threads,
    config_source,
    fit_warmup,
    given_fields,
    replicas_from_args,
)
from blockviz.core.requests import (
    ConfigSource,
    ForkRequest,
    InitGradsRequest,
    ReplayRequest,
    Session,
    TrainRequest,
    WorkRequest,
)
from blockviz.core.vocab import DataError


def session(args: argparse.Namespace) -> Session:
    """`--store`, `--max_running`, `--threads` and `--no_progress`, checked."""
    if args.max_running < 0:
        raise UsageError(f"--max_running: {args.max_running} is not allowed; must be >= 0")
    check_threads(args.threads)
    return Session(
        store=args.store or None,
        max_running=args.max_running,
        threads=args.threads,
        progress=not args.no_progress,
    )


def _seeds(args: argparse.Namespace) -> tuple[int, ...] | None:
    """`--seeds` as a tuple (None when not given); UsageError naming a bad value."""
    if args.seeds is None:
        return None
    if args.cfg_seed is not None:
        raise UsageError("--seeds and --seed: give one of them")
    for flag, value in (("--resume", args.resume), ("--run_id", args.run_id)):
        if value is not None:
            raise UsageError(f"--seeds cannot be combined with {flag}")
    try:
        return tuple(replicas.parse_seeds(args.seeds))
    except ValueError as exc:
        raise UsageError(f"--seeds: {exc}") from None


def _new_run_source(args: argparse.Namespace) -> ConfigSource:
    """A new run's config source, checked here, before anything slow is imported: the
    config is built and validated, a file dataset exists, and a warm-up the user did not
    type that is longer than a typed `--max_steps` is scaled down (with a note)."""
    source, note = fit_warmup(config_source(args))
    if note is not None:
        print(f"blockviz train: note: {note}", flush=True)
    try:
        check_dataset(build_config(source).data.dataset)
    except DataError as exc:
        raise UsageError(f"--{exc}" if args.cfg_dataset is not None else str(exc)) from None
    return source


def train_request(args: argparse.Namespace) -> TrainRequest:
    """`train`'s flags."""
    request_session = session(args)
    seeds = _seeds(args)
    # A resume's fields change its run's config, and a run the runner created (--run_id)
    # records a bad config as that run's failure: those are checked where they are planned.
    new_run = args.resume is None and args.run_id is None
    return TrainRequest(
        session=request_session,
        source=_new_run_source(args) if new_run else config_source(args),
        name=args.name,
        preset=args.preset,
        resume=args.resume,
        run_id=args.run_id,
        seeds=seeds,
        replicas=replicas_from_args(args) if seeds is not None else 1,
    )


def fork_request(args: argparse.Namespace) -> ForkRequest:
    """`fork`'s flags."""
    return ForkRequest(session(args), args.run, args.step, given_fields(args), args.name)


def replay_request(args: argparse.Namespace) -> ReplayRequest:
    """`replay`'s flags."""
    return ReplayRequest(session(args), args.run, args.around, args.after, args.name)


def work_request(args: argparse.Namespace) -> WorkRequest:
    """`study work`'s flags."""
    check_threads(args.threads)
    return WorkRequest(
        args.store, int(args.study), int(args.max_running), args.threads, replicas_from_args(args)
    )


def init_grads_request(args: argparse.Namespace) -> InitGradsRequest:
    """`init-grads`' flags."""
    if args.seeds < 1:
        raise UsageError(f"--seeds {args.seeds}: must be at least 1")
    if args.threads < 1:
        raise UsageError(f"--threads {args.threads}: must be at least 1")
    return InitGradsRequest(
        config_source(args),
        tuple(args.depths),
        tuple(args.inits),
        args.seeds,
        args.threads,
        args.json,
        args.quiet,
    )
