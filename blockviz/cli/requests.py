"""The training commands' flags, read once into the frozen requests (`core.requests`) the
training side takes: `train`, `fork`, `replay` and `study work`. A bad value is a
UsageError here, before anything is loaded or recorded.
"""

from __future__ import annotations

import argparse

from blockviz.core import replicas
from blockviz.core.flags import (
    UsageError,
    check_threads,
    config_source,
    given_fields,
    replicas_from_args,
)
from blockviz.core.requests import (
    ForkRequest,
    InitGradsRequest,
    ReplayRequest,
    Session,
    TrainRequest,
    WorkRequest,
)


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


def train_request(args: argparse.Namespace) -> TrainRequest:
    """`train`'s flags."""
    request_session = session(args)
    seeds = _seeds(args)
    return TrainRequest(
        session=request_session,
        source=config_source(args),
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
