"""`python -m blockviz fork RUN --step N [--FIELD VALUE ...]`: a twin of RUN from step N.

A fork starts from RUN's kept checkpoint at step N (`core.forks`) with the same data order
(batch N next: `data.CharDataModule` skips the batches before it) and the same random
state (`lit.LitCharModel` keeps it in every checkpoint), changed only in the fields given.
A field may change when the parameters keep their shapes (lr, warm-up, clipping, z_loss,
dropout, weight decay, norm position, softcap, ...): the checkpoint's weights and optimizer
moments must fit the fork's model. A fork with no change reproduces RUN from step N on.

The fork is a new run linked to its parent (parent_id, fork_step, fork_kind in the store),
holding a copy of the parent's rows from before step N (and the evaluation at N), so its
own charts start at step 0 and Compare can draw it as differences from the parent.
`python -m blockviz replay` (`training.replay`) is a fork with probes every step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from blockviz.core import config as cfg
from blockviz.core import forks
from blockviz.core.flags import UsageError
from blockviz.core.plans import Fork, Member, Plan, schedule_horizon
from blockviz.core.requests import ForkRequest
from blockviz.store import RunStore
from blockviz.store.records import RunRecord
from blockviz.training.callbacks import TrainingMonitor
from blockviz.training.lit import lr_at, param_groups
from blockviz.training.logger import PENDING_ROWS_KEY
from blockviz.training.model import CharTransformer
from blockviz.training.plan import load_datamodule, read_checkpoint
from blockviz.training.registration import run_plan, writer_store
from blockviz.training.train import apply_threads


def fork_plan(
    store: RunStore,
    parent_ref: str | int,
    step: int,
    overrides: dict[str, Any],
    kind: str = "fork",
    name: str | None = None,
    info: dict[str, Any] | None = None,
) -> tuple[Plan, Any, dict[str, Any]]:
    """What a fork of `parent_ref` at `step` trains, its data, and the parent's checkpoint
    as loaded (`prepared` writes the fork's start from it); UsageError when it cannot be
    (no such kept step, a shape-changing field, a fixed field). A replay (`kind`) keeps
    the parent's lr horizon and records `info` alone, not the fields it changed."""
    parent = store.get_run(parent_ref)
    run_dir = store.run_dir(int(parent.id))
    kept = forks.kept_steps(run_dir)
    if step not in kept:
        raise UsageError(forks.no_step_message(f"run {parent.id} ({parent.name})", step, kept))
    base = _parent_config(parent, run_dir)
    processes = base.train.devices * base.train.num_nodes
    if processes > 1:
        raise UsageError(
            f"run {parent.id} ({parent.name}) trained in {processes} processes (DDP), each "
            "drawing its own batches; a fork trains in one process, so it could not repeat "
            "them: such a run cannot be forked or replayed"
        )
    given = dict(overrides)
    if "norm_position" in given and "final_norm" not in given and base.model.final_norm is None:
        # "auto" follows norm_position; a fork keeps the parent's final norm instead, so a
        # Post-LN run forked to Pre-LN changes where the block's norms sit, nothing else.
        overrides = {**overrides, "final_norm": base.model.use_final_norm}
    config = cfg.replace(base, **overrides).validate() if overrides else base
    if config.train.max_steps <= step:
        raise UsageError(
            f"max_steps {config.train.max_steps} is not past the fork step {step}; "
            "give a larger --max_steps"
        )
    if config.train.devices * config.train.num_nodes > 1:
        raise UsageError("a fork trains in one process: give --devices 1 --num_nodes 1")
    checkpoint = forks.kept_path(run_dir, step)
    what = f"run {parent.id}'s checkpoint at step {step}"
    state = read_checkpoint(checkpoint, what)  # names a corrupt or foreign file
    full = state["loaded"]
    # The parent's config holds its vocabulary's size: the shapes are checked before the
    # text is even read.
    check_shapes(full, config, given)
    datamodule = load_datamodule(config)
    config = cfg.replace(config, vocab_size=datamodule.vocab.size).validate()
    # A --max_steps given to a fork sets where its decay ends, as it would for a new run
    # (a replay keeps the parent's); otherwise the parent's horizon stays.
    horizon = schedule_horizon(state, base)
    if "max_steps" in given and kind == "fork":
        horizon = config.train.max_steps
    changes = {field: getattr(getattr(config, cfg.section_of(field)), field) for field in given}
    label = name or forks.fork_label(kind, str(parent.name), step, changes)
    rows = forks.rows_before(full.get(PENDING_ROWS_KEY), step)
    fork_info = {"changes": changes, **(info or {})} if kind == "fork" else dict(info or {})
    plan = Plan(
        (Member(config, label, pending_rows=rows),),
        checkpoint=checkpoint,
        start_step=step,
        schedule_steps=horizon,
        fork=Fork(int(parent.id), kind, fork_info),
    )
    return plan, datamodule, full


def _parent_config(parent: RunRecord, run_dir: Path) -> cfg.RunConfig:
    try:
        return cfg.RunConfig.from_json((run_dir / "config.json").read_text(encoding="utf-8"))
    except OSError:
        if parent.config:
            return cfg.RunConfig.from_dict(parent.config)
        raise UsageError(f"run {parent.id} has no config to fork from") from None


def check_shapes(state: dict[str, Any], config: cfg.RunConfig, changed: dict) -> None:
    """UsageError unless the fork's model has exactly the checkpoint's parameter shapes and
    its optimizer the checkpoint's parameter groups (tied weights are one parameter)."""
    with torch.device("meta"):
        model = CharTransformer(config.model)
    ours = {f"model.{key}": tuple(value.shape) for key, value in model.state_dict().items()}
    theirs = {key: tuple(value.shape) for key, value in (state.get("state_dict") or {}).items()}
    fields = ", ".join(f"--{field}" for field in sorted(changed)) or "the config"
    why = None
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key):
            if key not in ours:
                why = f"the fork's model has no {key[6:]}"
            elif key not in theirs:
                why = f"the fork's model adds {key[6:]}"
            else:
                why = f"{key[6:]} would be {ours[key]} instead of {theirs[key]}"
            break
    groups = [len(group["params"]) for group in param_groups(model, config.train.weight_decay)]
    saved = (state.get("optimizer_states") or [{}])[0].get("param_groups") or []
    if why is None and [len(group.get("params") or []) for group in saved] != groups:
        why = "its optimizer would hold another set of parameters (tied or untied weights)"
    if why is not None:
        raise UsageError(
            f"{fields} changes the parameters ({why}): a fork keeps its parent's "
            "weights, so only fields that keep every parameter's shape may change "
            f"({', '.join(forks.OFFERED_FIELDS)}, ...)"
        )


def starting_state(
    state: dict[str, Any], config: cfg.RunConfig, step: int, horizon: int
) -> dict[str, Any]:
    """The parent's checkpoint as the fork starts from it: the optimizer's and schedule's
    hyperparameters rewritten from the fork's config (a checkpoint restores its own lr,
    weight decay and betas otherwise), no checkpoint callback's state (best.ckpt is the
    parent's), no rows carried (the fork copies them). Rewrites `state` in place."""
    train = config.train
    lr = lr_at(step, train, horizon)
    for optimizer in state.get("optimizer_states") or []:
        for index, group in enumerate(optimizer.get("param_groups") or []):
            group["lr"] = lr
            group["initial_lr"] = train.lr
            group["betas"] = (train.beta1, train.beta2)
            # lit.param_groups: the first group decays, the second never does.
            group["weight_decay"] = train.weight_decay if index == 0 else 0.0
    for scheduler in state.get("lr_schedulers") or []:
        count = len(scheduler.get("base_lrs") or [])
        scheduler["base_lrs"] = [train.lr] * count
        scheduler["_last_lr"] = [lr] * count
    hparams = state.get("hyper_parameters")
    if isinstance(hparams, dict):
        hparams["run_config"] = config.to_dict()
        hparams["schedule_steps"] = horizon
    # The checkpoints' callbacks (best.ckpt's score and path, the kept steps) are the
    # parent's; the training monitor's unlogged losses go on in the fork.
    callbacks = state.get("callbacks") or {}
    state["callbacks"] = {
        key: value for key, value in callbacks.items() if key == TrainingMonitor.__qualname__
    }
    state.pop(PENDING_ROWS_KEY, None)
    return state


@contextlib.contextmanager
def prepared(plan: Plan, datamodule: Any, loaded: dict[str, Any]) -> Iterator[tuple[Plan, Any]]:
    """The plan with its checkpoint replaced by the fork's starting state (`fork_plan`'s
    loaded checkpoint, rewritten), in a temporary file removed when the fit is over."""
    with tempfile.TemporaryDirectory(prefix="blockviz-fork-") as folder:
        path = Path(folder) / "start.ckpt"
        state = starting_state(loaded, plan.config, plan.start_step, plan.schedule_steps or 0)
        torch.save(state, path)
        del loaded, state  # not held through the fit
        yield dataclasses.replace(plan, checkpoint=path), datamodule


def main(request: ForkRequest) -> int:
    """`python -m blockviz fork RUN --step N [--FIELD VALUE ...]`: trains the fork."""
    apply_threads(request.session.threads, request.session.max_running)
    with writer_store(request.session, create=False) as store:
        overrides = forks.fork_overrides(request.fields)
        planned = fork_plan(store, request.run, request.step, overrides, name=request.name)
        with prepared(*planned) as (plan, datamodule):
            del planned
            return run_plan(plan, datamodule, store, request.session).exit_code
