"""`python -m blockviz study work ID`: train a study's runs one after another in one process.

A run's own process spends seconds importing torch and Lightning before its first step,
as long as a quick study's whole run; a worker pays that once and then trains run after
run, each still its own run (its own row, status, log folder and slot in the queue) through
the same `train` lifecycle. Several workers share a study: each claims the next unclaimed
run (`RunStore.claim_study_run`), so none trains a run twice.

A run that trained before (queued again by `study resume`, or because its process was lost)
continues from its checkpoint, with the rest of its batch. A worker with nothing left to
claim stays while other runs of its study train elsewhere, looking every IDLE_POLL_S: when
one of them is lost (its process gone, or another host silent past the remote window,
`store.liveness`), reaping queues it again and this worker takes it over.

Stopping: SIGTERM while a run trains stops that run (it records 'stopped'); the worker then
looks at its study and carries on only while the study is still 'running'. SIGTERM between
runs ends the worker. The last worker out marks the study completed. A worker whose store
file was removed or replaced (another file at the path) stops before its next claim with
one line, exit status 1; it never creates a store (nor does the `train` it runs a run in).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import logging
import os
import signal
import sys
import time
from types import FrameType

from blockviz.core import procs, replicas
from blockviz.core.config_model import INITS
from blockviz.core.files import atomic_write
from blockviz.core.requests import Session, WorkRequest
from blockviz.core.studies.define import StudyDef, plan_from_spec
from blockviz.store import RunStore
from blockviz.store.studies import INIT_GRADS_FILE
from blockviz.training import init_grads
from blockviz.training.lifecycle import patiently
from blockviz.training.plan import plan_claimed
from blockviz.training.registration import fail_runs
from blockviz.training.train import apply_threads, train
from blockviz.training.trainer import quiet_lightning

log = logging.getLogger(__name__)

IDLE_POLL_S = 2.0  # a worker with nothing to claim looks again this often for lost runs


class _Quit:
    """SIGTERM / Ctrl-C between runs: leave after the run in hand (if any)."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def train_runs(
    store: RunStore, run_ids: list[int], max_running: int, threads: int | None = None
) -> int:
    """Train claimed runs through the `train` lifecycle: one alone, or several that share
    every shape as replicas of one batched model; the exit code."""
    session = Session(store.location.text, max_running, threads)
    try:
        return train(plan_claimed(store, run_ids), session).exit_code
    except Exception as exc:  # a bad config or dataset: these runs fail, the study goes on
        message = f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)
        what = f"run {run_ids[0]}" if len(run_ids) == 1 else f"runs {run_ids}"
        log.error("study %s could not start: %s", what, message)
        print(f"blockviz: {what} failed to start: {message}", file=sys.stderr, flush=True)
        fail_runs(store, run_ids, message)
        return 1


def release_freed_memory() -> bool:
    """Hand the memory a finished run freed back to the OS (glibc's malloc_trim).

    A worker trains run after run in one process; glibc keeps what each run freed (its
    data tensors, its model) in the heap, fragmented, so the worker's RSS grew about
    3.6 MiB per quick run (BENCHMARKS.md). False where there is no glibc (macOS, musl).
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    gc.collect()
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True


def work(
    store_path: str,
    study_id: int,
    max_running: int,
    threads: int | None = None,
    replica_limit: int = replicas.CPU_REPLICAS,
) -> int:
    """Claim and train the study's runs until none is left or the study is stopped.

    Each run takes `threads` CPU threads, by default its share of the cores (cores ÷ slots).
    Runs that share every shape are claimed together, up to `replica_limit`, and train as
    replicas of one batched model (`blockviz.training.replicas`); 1 trains each alone.
    """
    # The worker's own torch work (the init-gradients measurement) takes the same share.
    apply_threads(threads, max_running)
    quit_request = _Quit()
    previous = {s: signal.signal(s, quit_request) for s in (signal.SIGTERM, signal.SIGINT)}
    me = procs.identity_of()
    trained = 0
    try:
        with RunStore(store_path, create=False) as store:
            plan = plan_from_spec(store.get_study(study_id).spec)
            if not plan.trains:
                return measure_at_init(store, study_id, plan)
            while not quit_request.requested:
                changed = store.file_changed()
                if changed is not None:
                    # Training on would write into the old file, or into a store that is
                    # not this study's: stop, and create nothing at the path.
                    print(
                        f"blockviz: study {study_id}: the run store {store.where} was {changed} "
                        f"while this worker ran; it stops after {trained} run(s) and creates "
                        "no new store there",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 1
                study = patiently(store.get_study, study_id)
                if study.status != "running":
                    break
                workers = len(study.workers or ()) or 1
                patiently(store.reap_dead)  # lost runs of the study are queued again
                run_ids = patiently(
                    store.claim_study_runs,
                    study_id,
                    os.getpid(),
                    me.started if me else None,
                    replica_limit,
                    replicas.stored_batch_key,
                    workers,
                )
                if not run_ids:
                    if not patiently(store.study_active_runs, study_id):
                        break
                    time.sleep(IDLE_POLL_S)  # the others may yet be lost
                    continue
                train_runs(store, run_ids, max_running, threads)
                trained += len(run_ids)
                release_freed_memory()
            _finish(store, study_id)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print(f"blockviz: study {study_id}: this worker trained {trained} run(s)", flush=True)
    return 0


def measure_at_init(store: RunStore, study_id: int, plan: StudyDef) -> int:
    """A study that does not train: the init explorer's measurement over its depths and
    inits (Pre-LN and Post-LN each), written to the study's folder as JSON."""
    configs = [plan.config_for(v.label) for v in plan.variants]
    depths = sorted({c.model.n_layer for c in configs})
    inits = [i for i in INITS if i in {c.model.init for c in configs}]
    seeds = list(range(len(plan.seeds)))
    try:
        result = init_grads.run(configs[0], depths, inits, seeds)
        folder = store.study_dir(study_id)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / INIT_GRADS_FILE, json.dumps(result))
    except Exception as exc:
        log.exception("study %s: the measurement failed", study_id)
        store.update_study(study_id, status="stopped", ended=time.time(), error=str(exc))
        return 1
    store.update_study(study_id, status="completed", ended=time.time())
    print(f"blockviz: study {study_id}: measured {len(depths)} depths × {len(inits)} inits")
    return 0


def _finish(store: RunStore, study_id: int) -> None:
    """End the study once no run of it is left to train (completed only when every run
    finished: `RunStore.settle_study`)."""
    store.settle_study(study_id)


def main(request: WorkRequest) -> int:
    """`study work`: the worker process the study runner starts."""
    quiet_lightning()
    return work(
        request.store, request.study, request.max_running, request.threads, request.replicas
    )
