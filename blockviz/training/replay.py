"""`python -m blockviz replay RUN [--around STEP]`: the flight recorder.

A loss spike or a divergence says *that* something broke, not *what broke first*. A replay
re-runs RUN from its last kept checkpoint before the event, exactly as it ran (a fork with
no change: same data order, same random state), with probes at every step, into a new run
linked to RUN (fork_kind "replay"); then `core.flight` compares every per-block and
per-head statistic of the replay with the range RUN's own earlier probes set and names the
first one to leave it, with its step. The result is kept with the replay run (fork_info)
and RUN's spike or divergence finding cites it. `--around` a step that is neither the
divergence nor a loss out of its range replays a window of the run, not an event, and
says so.
"""

from __future__ import annotations

from typing import Any

from blockviz.core import flight, flight_start, forks
from blockviz.core.findings.base import DIVERGENCE, SPIKE, run_series
from blockviz.core.findings.replay import replay_result
from blockviz.core.findings.training import loss_spikes
from blockviz.core.flags import UsageError
from blockviz.core.plans import Plan
from blockviz.core.requests import ReplayRequest
from blockviz.core.spec import TRAIN_LOSS
from blockviz.store import RunStore
from blockviz.store.records import RunRecord
from blockviz.training.fork import fork_plan, prepared
from blockviz.training.registration import run_plan, writer_store
from blockviz.training.train import apply_threads

# Steps replayed past the event (its aftermath shows which statistics followed).
AFTER_DEFAULT = 10


def find_event(store: RunStore, parent: RunRecord, around: int | None) -> tuple[str, int]:
    """(kind, step) of what to replay: `around` (a divergence or a loss spike when the
    run's loss there says so, else a window), else the divergence, else the largest loss
    spike; UsageError when the run shows neither."""
    if around is not None:
        if around < 1:
            raise UsageError(f"--around {around}: give a step after the first")
        if parent.step is not None and around > int(parent.step):
            raise UsageError(
                f"--around {around}: run {parent.id} ({parent.name}) got to step "
                f"{int(parent.step)}; give a step it trained"
            )
        if parent.diverged_step == around:
            return DIVERGENCE, around
        spikes = flight_start.out_of_range(store.scalars(int(parent.id), TRAIN_LOSS))
        return (SPIKE if around in set(spikes.tolist()) else flight.AROUND), around
    if parent.status == "diverged" and parent.diverged_step is not None:
        return DIVERGENCE, int(parent.diverged_step)
    scalars = store.scalars(int(parent.id), TRAIN_LOSS)
    empty = store.layer_stats(int(parent.id), kind="head", step=-1)
    finding = loss_spikes(run_series(parent, scalars, empty))
    if finding is None or finding.step is None:
        raise UsageError(
            f"run {parent.id} ({parent.name}) neither diverged nor spiked; give --around STEP "
            "to replay the steps before another one"
        )
    return SPIKE, int(finding.step)


def replay_plan(
    store: RunStore, request: ReplayRequest
) -> tuple[tuple[Plan, Any, dict[str, Any]], dict[str, Any]]:
    """The fork that replays the event (`fork_plan`'s plan, data and loaded checkpoint),
    and what it replays."""
    parent = store.get_run(request.run)
    kind, step = find_event(store, parent, request.around)
    if request.after < 0:
        raise UsageError(f"--after {request.after}: give 0 or more steps")
    kept = forks.kept_steps(store.run_dir(int(parent.id)))
    onset = step
    if kind != flight.AROUND:
        onset = flight_start.loss_onset(store.scalars(int(parent.id), TRAIN_LOSS), step)
    chosen = flight_start.replay_start(kept, onset, step)
    if chosen is None:
        raise UsageError(
            f"run {parent.id} ({parent.name}) keeps no checkpoint before step {step} "
            f"(kept: {forks.steps_text(kept)}); train it with a smaller --ckpt_interval"
        )
    max_steps = int((parent.config or {}).get("train", {}).get("max_steps") or step + 1)
    end = min(max_steps, step + 1 + request.after)
    info = {"event": kind, "event_step": step, "onset": chosen.onset}
    planned = fork_plan(
        store,
        int(parent.id),
        chosen.start,
        # Every step probed; nothing kept; the schedule stays the parent's (a replay's).
        {"probe_interval": 1, "ckpt_interval": 0, "max_steps": end},
        kind="replay",
        name=request.name or f"{parent.name} replay of step {step}",
        info=info,
    )
    return planned, {"parent": parent, "start": chosen.start, **info}


def analyse(store: RunStore, replay_id: int, what: dict[str, Any]) -> dict[str, Any]:
    """The first statistic out of its healthy range, as the replay run keeps it."""
    parent: RunRecord = what["parent"]
    start, step, event = int(what["start"]), int(what["event_step"]), str(what["event"])
    onset = int(what["onset"])
    parent_id = int(parent.id)
    # Only what the rule reads: the scanned scalars and kinds (not every tensor's rows).
    scalars, kinds = flight.SCANNED_SCALARS, flight.SCANNED_KINDS
    ranges = flight.healthy_ranges(
        store.scalars(parent_id, scalars), store.layer_stats(parent_id, kinds), start
    )
    n_layer = int(((parent.config or {}).get("model") or {}).get("n_layer") or 0)
    return replay_result(
        ranges,
        store.scalars(replay_id, scalars, after_step=start),
        store.layer_stats(replay_id, kinds, after_step=start),
        start,
        step,
        event,
        n_layer,
        onset,
    )


def main(request: ReplayRequest) -> int:
    """`python -m blockviz replay RUN [--around STEP] [--after N]`: prints what broke first."""
    apply_threads(request.session.threads, request.session.max_running)
    with writer_store(request.session, create=False) as store:
        planned, what = replay_plan(store, request)
        with prepared(*planned) as (plan, datamodule):
            del planned
            ran = run_plan(plan, datamodule, store, request.session)
        store.flush()
        replay_id = ran.run_ids[0] if ran.run_ids else None
        if replay_id is None or store.get_run(replay_id).status not in ("completed", "diverged"):
            return ran.exit_code  # it never trained to its end (stopped, failed): said above
        result = analyse(store, replay_id, what)
        store.update_run(replay_id, fork_info=result)
        print(f"blockviz: replay {replay_id}: {result['sentence']}", flush=True)
        return ran.exit_code
