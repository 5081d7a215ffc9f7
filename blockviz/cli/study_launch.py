"""`python -m blockviz study launch ID --slurm|--local N`: a stored study's workers started
through submitit (blockviz.launch.cluster), a SLURM job array or N processes here; each runs
`python -m blockviz study work ID --store STORE`. Torch-free; submitit is imported only when
the command runs.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from blockviz.core import replicas
from blockviz.core.flags import (
    UsageError,
    check_threads,
    replicas_arg,
    replicas_from_args,
    threads_arg,
)
from blockviz.store import RunStore
from blockviz.store.location import redact
from blockviz.views.commands import command_line

EXIT_OK = 0


def build(sub: Any, store_help: str) -> None:
    """The `study launch` subcommand's parser, on the `study` command's subparsers."""
    text = (
        "start a stored study's workers through submitit: a SLURM job array (--slurm) or "
        "N processes here (--local N); each runs `python -m blockviz study work ID --store "
        "STORE`"
    )
    p = sub.add_parser("launch", help=text, description=text)
    p.add_argument("id", help="study id (see `study list`)")
    p.add_argument("--store", help=store_help)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--slurm", action="store_true", help="submit the workers with sbatch")
    where.add_argument("--local", type=int, metavar="N", help="start N workers on this machine")
    p.add_argument(
        "--time_min",
        type=int,
        metavar="INT",
        help="minutes each worker may run before it is stopped (SLURM's time limit; "
        "default 1440, a day)",
    )
    p.add_argument(
        "--requeues",
        type=int,
        metavar="INT",
        help="times a worker stopped by its time limit or a preemption is requeued, resuming "
        "the study's stopped runs (default 3; 0: never; at most 5 with --local)",
    )
    p.add_argument("--folder", help="folder for the jobs' logs (default <store>.studies/<id>/jobs)")
    threads_arg(p)
    replicas_arg(p)
    slurm = p.add_argument_group("with --slurm")
    slurm.add_argument(
        "--workers", type=int, metavar="INT", help="the job array's size (default 1)"
    )
    slurm.add_argument("--partition", help="SLURM partition (default: the cluster's)")
    slurm.add_argument("--gpus_per_task", type=int, metavar="INT", help="GPUs for each worker")
    slurm.add_argument("--cpus_per_task", type=int, metavar="INT", help="CPUs for each worker")
    slurm.add_argument(
        "--array_parallelism",
        type=int,
        metavar="INT",
        help="at most this many workers at once (default: all)",
    )


def cli_main(args: argparse.Namespace) -> int:
    """`study launch ID --slurm|--local N`."""
    from blockviz.launch import cluster

    check_threads(args.threads)
    # `auto` travels to the workers: each resolves it where it trains (a GPU node, say).
    auto = str(args.replicas).strip().lower() == replicas.AUTO
    replica_limit = None if auto else replicas_from_args(args)
    time_min = cluster.DEFAULT_TIME_MIN if args.time_min is None else args.time_min
    requeues = cluster.DEFAULT_REQUEUES if args.requeues is None else args.requeues
    if args.local is not None:
        given = [
            f"--{name}"
            for name in (
                "workers",
                "partition",
                "gpus_per_task",
                "cpus_per_task",
                "array_parallelism",
            )
            if getattr(args, name) is not None
        ]
        if given:
            raise UsageError(f"{given[0]} is for --slurm; --local N starts N workers here")
        cluster.check_count("--local", args.local)
        cluster.check_requeues(requeues, cluster.LOCAL_MAX_REQUEUES)
    else:
        cluster.check_requeues(requeues)
    with RunStore(args.store or None, create=False) as store:
        study_id = int(store.get_study(args.id).id)
        if args.slurm:
            options = cluster.SlurmOptions(
                workers=1 if args.workers is None else args.workers,
                partition=args.partition,
                gpus_per_task=args.gpus_per_task,
                cpus_per_task=args.cpus_per_task,
                array_parallelism=args.array_parallelism,
                time_min=time_min,
                requeues=requeues,
            )
            done = cluster.launch_slurm(
                store, study_id, options, args.threads, replica_limit, args.folder
            )
            what = f"submitted {len(done.job_ids)} worker(s) to SLURM"
        else:
            done = cluster.launch_local(
                store,
                study_id,
                args.local,
                args.threads,
                replica_limit,
                time_min,
                args.folder,
                requeues,
            )
            what = f"started {len(done.job_ids)} worker(s) on this machine"
    print(f"blockviz: study {study_id}: {what}, job(s) {', '.join(done.job_ids)}")
    print(f"blockviz: each runs `{redact(shlex.join(['python', *done.command]))}`")
    print(f"blockviz: the jobs' logs: {done.folder}")
    print(f"blockviz: watch it with `{command_line(store, 'study', 'show', str(study_id))}`")
    return EXIT_OK
