"""Kept checkpoints and forks, as both sides see them (no torch).

A run keeps a checkpoint every `ckpt_interval` steps in `<run_dir>/checkpoints/step-N.ckpt`
(besides last.ckpt and best.ckpt): the steps a fork (`python -m blockviz fork`) or a replay
(`python -m blockviz replay`) can start from. At most `ckpt_keep` stay on disk: when one
more is written, the spacing doubles and the checkpoints off the new spacing go, the first
one excepted (early steps are where forks over warm-up and norm placement start). A
default run (interval 100, keep 8, 2,000 steps) ends with steps 100, 400, 800, 1200, 1600
and 2000; once thinned, a run's kept checkpoints use at most `ckpt_keep` checkpoints' disk
(one more between a write and its thinning).
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from blockviz.core import config as cfg
from blockviz.core.fields import FORK_FIXED, FORK_OFFERED
from blockviz.core.flags import UsageError, coerce_fields
from blockviz.core.spec import EVAL_SCALARS

CHECKPOINTS_DIR = "checkpoints"
KEPT_PATTERN = re.compile(r"^step-(\d{1,9})\.ckpt$")
# Fields a fork may not change whatever the shapes: what the checkpoint is of.
FIXED_FIELDS = tuple(name for name, spec in cfg.FIELDS.items() if spec.fork == FORK_FIXED)
# Fields Live's fork panel offers: each keeps every parameter's shape.
OFFERED_FIELDS = tuple(name for name, spec in cfg.FIELDS.items() if spec.fork == FORK_OFFERED)


def kept_name(step: int) -> str:
    """The file name of the kept checkpoint at `step`."""
    return f"step-{int(step)}.ckpt"


def kept_path(run_dir: Path, step: int) -> Path:
    """Where the kept checkpoint of `step` lives in a run's folder."""
    return Path(run_dir) / CHECKPOINTS_DIR / kept_name(step)


class _Opaque(dict):  # type: ignore[type-arg]
    """Whatever a checkpoint's pickle builds besides plain data (tensors, storages): an
    empty stand-in, so nothing the file names is imported or run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _StepReader(pickle.Unpickler):
    """Reads a checkpoint's plain data only: every class it names is `_Opaque`, every
    tensor's storage None."""

    def find_class(self, module: str, name: str) -> Any:
        return _Opaque

    def persistent_load(self, pid: Any) -> None:
        return None


def checkpoint_step(path: Path) -> int | None:
    """The step a training checkpoint was written at, read without torch (its zip's pickle,
    no tensor loaded, nothing it names imported); None when the file does not read so."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickled = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "data.pkl"]
            state = _StepReader(io.BytesIO(archive.read(pickled[0]))).load()
    except Exception:  # missing, truncated, not a zip, not a pickle: no step to tell
        return None
    step = state.get("global_step") if isinstance(state, dict) else None
    return step if type(step) is int and step >= 0 else None


def kept_steps(run_dir: Path) -> list[int]:
    """The steps of a run's kept checkpoints on disk, ascending ([] for none)."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    try:
        names = [entry.name for entry in folder.iterdir() if entry.is_file()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(KEPT_PATTERN.match, names) if m)


def thinned(steps: Iterable[int], every: int, keep: int) -> tuple[int, list[int]]:
    """(spacing, steps to delete) so that at most `keep` of `steps`, kept on the spacing
    `every`, stay: double the spacing until they fit, keeping the first step and the
    multiples of the spacing."""
    ordered = sorted(set(steps))
    while len(ordered) > keep:
        every *= 2
        ordered = ordered[:1] + [step for step in ordered[1:] if step % every == 0]
    dropped = sorted(set(steps) - set(ordered))
    return every, dropped


def nearest_kept(steps: Iterable[int], wanted: int) -> int | None:
    """The latest kept step at or before `wanted` (None when there is none)."""
    earlier = [step for step in steps if step <= wanted]
    return max(earlier) if earlier else None


def steps_text(steps: list[int]) -> str:
    """'100, 400, 800' or 'none' (interval checkpoints off or none written yet)."""
    return ", ".join(f"{step}" for step in steps) if steps else "none"


def fork_label(kind: str, parent: str, step: int, changes: Mapping[str, Any]) -> str:
    """A fork's default name: 'postln fork@100 norm_position=pre'; a replay's
    'postln replay@400'."""
    changed = " ".join(f"{field}={value}" for field, value in sorted(changes.items()))
    return f"{parent} {kind}@{step}" + (f" {changed}" if changed else "")


def changes_text(changes: Mapping[str, Any]) -> str:
    """What a fork changed, as every view says it: 'norm_position pre, lr 0.003', or
    'no change'."""
    return ", ".join(f"{field} {value}" for field, value in changes.items()) or "no change"


def no_step_message(where: str, step: int, kept: list[int]) -> str:
    """Why `step` cannot be forked from run `where`, with the steps that can."""
    if not kept:
        return (
            f"--step {step}: {where} keeps no checkpoints to fork from (it trained with "
            "ckpt_interval 0, or before kept checkpoints existed); train with --ckpt_interval N"
        )
    return f"--step {step}: {where} keeps checkpoints at steps {steps_text(kept)}; pick one"


def rows_before(pending: Any, step: int) -> dict[str, list[list[Any]]] | None:
    """The rows a parent's checkpoint carried that belong to the fork's copied past
    (before `step`, and the evaluation at it)."""
    if not isinstance(pending, dict):
        return None
    kept: dict[str, list[list[Any]]] = {}
    for table, rows in pending.items():
        if not isinstance(rows, list):
            continue
        kept[str(table)] = [
            row
            for row in rows
            if isinstance(row, (list, tuple))
            and row
            and isinstance(row[0], int)
            and (
                row[0] < step or (table == "scalars" and row[0] == step and row[1] in EVAL_SCALARS)
            )
        ]
    return kept or None


def fork_overrides(fields: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The config fields given on the command line; UsageError for a fixed one."""
    overrides = coerce_fields(fields, list(cfg.SECTIONS))
    fixed = sorted(set(overrides) & set(FIXED_FIELDS))
    if fixed:
        raise UsageError(
            f"--{fixed[0]} cannot change in a fork: the checkpoint was trained on the "
            "parent's text; fork from a run of that text instead"
        )
    return overrides
