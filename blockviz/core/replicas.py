"""Which runs can train as replicas of one batched model, and how they are grouped.

Replicas (`blockviz.training.replicas`) stack K models of the same shapes and train them
as one batched model in one process. Each keeps its own parameters, optimizer state,
hyperparameters and data order, so two runs can share a batch when their configs differ
only in the fields below: what each replica's optimizer, schedule, loss or initialisation
reads per replica. Every other field (the architecture, the batch and block size, the
steps and the cadence, the data, the hardware) is shared by the batch and must be equal.

Some configs never batch, for a stated reason (`why_solo`): they train alone, as today.
This module is torch-free; the study runner and the CLI group runs with it.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from blockviz.core import hardware
from blockviz.core.config import FIELDS, RunConfig
from blockviz.core.fields import ConfigError

# Fields a replica holds on its own (section, field); any other field is shared.
PER_REPLICA_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (spec.section, name) for name, spec in FIELDS.items() if spec.per_replica
)

# In each member's run folder: the batch it trained in (its members' run ids, its index).
BATCH_FILE = "replicas.json"
# Beside the run folders: one folder per batch, named after its first member, holding the
# batch's checkpoints.
BATCHES = "batches"

# The most replicas one batch holds unless asked otherwise (`--replicas K`): `auto`, the
# flag's default, is GPU_REPLICAS where the process that parses it sees a GPU (issue 34
# measured a solo baby-cpu step on an H100 bound by per-step host work, which a batch
# shares), else CPU_REPLICAS, the default before.
AUTO = "auto"
DEFAULT_REPLICAS = AUTO
CPU_REPLICAS = 8
GPU_REPLICAS = 64
MAX_REPLICAS = 256  # what one process may stack; each replica is a whole model in memory
MAX_SEEDS_FLAG = MAX_REPLICAS  # `train --seeds` takes at most this many

T = TypeVar("T", bound=Hashable)


def why_solo(config: RunConfig) -> str | None:
    """Why this config cannot train as a replica (None: it can).

    - dropout > 0: the batch draws one random stream for all its replicas, so a replica's
      dropout masks would not be its solo run's; replicas promise the solo run's losses.
    - batchnorm: its running statistics are buffers updated in place during the forward
      pass, one set per model, which a stack of parameters does not hold.
    - 16-bit precision, several devices or nodes, a strategy: one loss scale for the
      batch; the batched step runs on one device.
    (`compile` batches: the stacked forward is compiled once for the batch.)
    """
    model, train = config.model, config.train
    if model.dropout > 0:
        return "dropout > 0 draws its masks from one random stream for the whole batch"
    if model.norm_type == "batchnorm" and model.norm_position != "none":
        return "batchnorm updates running statistics in place, one set per model"
    if train.precision in ("16-mixed", "16", "16-true"):
        # One GradScaler for the batch: one replica's overflow would skip every replica's step.
        return "16-bit precision scales every replica's gradients with one loss scale"
    if train.devices != 1 or train.num_nodes != 1 or train.strategy not in ("auto",):
        return "several devices, nodes or a DDP strategy: replicas train on one device"
    return None


def batch_key(config: RunConfig) -> str:
    """A text equal for two configs exactly when they may share a batch (shared fields)."""
    data = config.to_dict()
    for section, name in PER_REPLICA_FIELDS:
        data[section].pop(name, None)
    return json.dumps(data, sort_keys=True)


def stored_batch_key(config_text: str | None) -> str | None:
    """The batch key of a stored config (None: it trains alone, or it is unreadable)."""
    try:
        config = RunConfig.from_json(config_text or "")
    except (ValueError, TypeError, ConfigError):
        return None
    return None if why_solo(config) is not None else batch_key(config)


def even_batch(count: int, limit: int) -> int:
    """The size of the first of the fewest batches of at most `limit` that hold `count`
    items, as even as they can be (14 at most 8 at once: 7, then 7; 9: 5, then 4), so
    the workers of a study get batches of about one size."""
    if count <= 0:
        return 0
    batches = -(-count // max(1, limit))
    return -(-count // batches)


def group(items: Sequence[tuple[T, RunConfig]], limit: int) -> list[list[T]]:
    """The items grouped into even batches of at most `limit` that share a batch key.

    An item whose config cannot batch (`why_solo`), or a limit of 1, gives a batch of one.
    Batches come in the order of their first item, so the order of the runs is kept as
    far as the grouping allows.
    """
    if limit < 1:
        raise ValueError(f"limit {limit} must be >= 1")
    placed: list[tuple[int, list[T]]] = []
    keyed: dict[str, list[tuple[int, T]]] = {}
    for position, (item, config) in enumerate(items):
        if limit == 1 or why_solo(config) is not None:
            placed.append((position, [item]))
        else:
            keyed.setdefault(batch_key(config), []).append((position, item))
    for members in keyed.values():
        while members:
            size = even_batch(len(members), limit)
            chunk, members = members[:size], members[size:]
            placed.append((chunk[0][0], [item for _, item in chunk]))
    return [batch for _, batch in sorted(placed, key=lambda entry: entry[0])]


def parse_seeds(text: str, limit: int = MAX_SEEDS_FLAG) -> list[int]:
    """`0,1,2` or `0-3` (or both, `0,5-7`) as a list of distinct seeds, at most `limit` of
    them (a range is counted before it is expanded); ValueError says why."""
    seeds: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"{text!r} has an empty item; write seeds as 0,1,2 or 0-3")
        low, dash, high = part.partition("-")
        ends = (low, high) if dash and low else (part, part)  # `-1` is one (negative) seed
        try:
            first, last = int(ends[0]), int(ends[1])
        except ValueError:
            raise ValueError(f"{part!r} is not a seed; write seeds as 0,1,2 or 0-3") from None
        if last < first:
            raise ValueError(f"the range {part!r} runs backwards; write it as {last}-{first}")
        if len(seeds) + last - first + 1 > limit:
            raise ValueError(f"{text!r} names more than {limit} seeds")
        seeds.extend(range(first, last + 1))
    negative = [seed for seed in seeds if seed < 0]
    if negative:
        raise ValueError(f"{text!r} names seed {negative[0]}; a seed must be >= 0")
    twice = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if twice:
        raise ValueError(f"{text!r} names seed {twice[0]} twice")
    return seeds


def default_replicas() -> int:
    """What `--replicas auto` means here: GPU_REPLICAS where a GPU is visible
    (`hardware.visible_gpus`), else CPU_REPLICAS."""
    return GPU_REPLICAS if hardware.visible_gpus() else CPU_REPLICAS


def parse_replicas(text: str) -> int:
    """`--replicas K|auto|off`: the most replicas per batch (auto: `default_replicas()`;
    off: 1, every run alone)."""
    word = str(text).strip().lower()
    if word == "off":
        return 1
    if word == AUTO:
        return default_replicas()
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a number of replicas; give K (1-{MAX_REPLICAS}), auto or off"
        ) from None
    if not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"{value} replicas is not allowed; give 1 to {MAX_REPLICAS}, auto or off")
    return value


def batch_folder(run_dir: Path, batch: int) -> Path:
    """The folder of batch `batch` (its checkpoints), beside a member's run folder: of its
    own, so deleting any member leaves the others resumable."""
    return Path(run_dir).parent / BATCHES / str(int(batch))


def write_batch_file(
    run_dir: Path,
    run_ids: Sequence[int],
    index: int,
    leader: int | None = None,
    batch: int | None = None,
) -> None:
    """Record in a member's folder the batch it trains in: its members, its own index, and
    where the batch's checkpoint is: `batch_folder(run_dir, batch)`, or (batches trained
    before batch folders) the folder of member `leader` (default the first)."""
    from blockviz.core.files import atomic_write

    data: dict[str, Any] = {"runs": [int(i) for i in run_ids], "index": int(index)}
    if batch is not None:
        data["batch"] = int(batch)
    else:
        data["leader"] = int(run_ids[0] if leader is None else leader)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(run_dir) / BATCH_FILE, json.dumps(data))


def read_batch_file(run_dir: Path) -> dict[str, Any] | None:
    """A member's batch file (None: the run trained alone, or the file is unreadable)."""
    try:
        data = json.loads((Path(run_dir) / BATCH_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not runs or not all(type(r) is int for r in runs):
        return None
    index, batch = data.get("index"), data.get("batch")
    if type(index) is not int or not 0 <= index < len(runs) or len(set(runs)) != len(runs):
        return None
    if batch is not None:
        return data if type(batch) is int and batch >= 1 else None
    leader = data.get("leader", runs[0])
    if type(leader) is not int or leader not in runs:
        return None
    return {**data, "leader": leader}


def checkpoint_path(run_dir: Path, run_dirs_of: Any) -> Path:
    """Where a run's resumable checkpoint is: its own last.ckpt, or its batch's (in the
    batch's folder, or for an older batch its first member's, `run_dirs_of(id)` giving a
    member's folder)."""
    batch = read_batch_file(run_dir)
    if batch is None:
        folder = Path(run_dir)
    elif "batch" in batch:
        folder = batch_folder(run_dir, batch["batch"])
    else:
        folder = Path(run_dirs_of(batch["leader"]))
    return folder / "checkpoints" / "last.ckpt"


def resumed_together(run_id: int, run_dirs_of: Any) -> list[int] | None:
    """The runs that continue with run `run_id` from its checkpoint: the members of its
    batch (the batch's checkpoint holds all of them), or the run alone; None when it has
    no checkpoint here (`run_dirs_of(id)` gives a run's folder)."""
    run_dir = Path(run_dirs_of(run_id))
    if not checkpoint_path(run_dir, run_dirs_of).is_file():
        return None
    batch = read_batch_file(run_dir)
    return [int(run_id)] if batch is None else [int(i) for i in batch["runs"]]


def folder_left_behind(run_dir: Path, run_dirs_of: Any, present: Any) -> Path | None:
    """The batch folder a deleted member leaves behind once no other member holds it
    (`present(ids)`: those of `ids` still in the store; a member that trained again alone
    or in another batch since holds it no more); None while one does."""
    batch = read_batch_file(run_dir)
    if batch is None or "batch" not in batch:
        return None
    me = batch["runs"][batch["index"]]
    for other in present([i for i in batch["runs"] if i != me]):
        theirs = read_batch_file(run_dirs_of(other)) or {}
        if (theirs.get("batch"), theirs.get("runs")) == (batch["batch"], batch["runs"]):
            return None
    return batch_folder(run_dir, batch["batch"])
