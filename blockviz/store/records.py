"""Typed rows: a run (RunRecord) and a study (StudyRecord), each built in one place.

`RunStore.get_run` and `get_study` return these instead of dicts: a field per column, the
JSON columns decoded, and nothing to mutate (a page that shows a run differently builds a
new record with `dataclasses.replace`). `to_dict` gives the mapping the store returned
before, for JSON output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict, cast

from blockviz.store.values import decode_json


def _object(text: str | None) -> dict[str, Any] | None:
    """A JSON column that holds an object: the dict, or None (NULL, not JSON, not an object)."""
    value = decode_json(text)
    return value if isinstance(value, dict) else None


class StoredConfig(TypedDict, total=False):
    """A run's `config` column: `RunConfig.to_dict()`, one object per section, each field by
    name (`core.config.FIELDS`). `RunConfig.from_dict` reads it back and checks it; one of
    an older version may lack later fields (their defaults apply)."""

    model: dict[str, Any]
    train: dict[str, Any]
    data: dict[str, Any]


class FinalMetrics(TypedDict, total=False):
    """A run's `final` column (`training.final_metrics`): what it ended with, a value that
    was not finite as None. A run that ended before writing them has none (the column is
    NULL); one of an older version may lack the later keys."""

    train_loss: float | None  # the recent train loss
    val_loss: float | None  # the last evaluation
    val_ppl: float | None
    val_bpc: float | None
    answer_acc: float | None  # ops runs only
    answer_baseline: float | None
    time_s: float | None  # training wall time, evaluations included
    tokens_per_sec: float | None  # while training, evaluations excluded
    steps: int | None  # the step the fit ended at


# A fork's or replay's `fork_info` column. A fork: `changes`, the fields it changed and
# their values (`training.fork`). A replay: the `event` it replays and its `event_step`;
# once it has run, its `start`, the first statistic out of the parent's healthy range
# (`break`, `core.flight.Break.to_dict()`, or None) and the `sentence` that says so
# (`core.findings.replay.replay_result`). ("break" is a keyword: hence the call syntax.)
ForkInfo = TypedDict(
    "ForkInfo",
    {
        "changes": dict[str, Any],
        "event": str,
        "event_step": int,
        "start": int,
        "break": dict[str, Any] | None,
        "sentence": str,
    },
    total=False,
)


@dataclass(frozen=True)
class RunRecord:
    """One row of the runs table, in its column order (schema.RUN_COLUMNS).

    A column the file does not have (a version 1 store opened read-only) reads as None.
    Times are unix seconds.
    """

    id: int
    name: str
    created: float | None = None
    started: float | None = None
    ended: float | None = None
    status: str | None = None  # core.spec.STATUSES
    config: StoredConfig | None = None
    dataset: dict[str, Any] | None = None  # the dataset's fingerprint
    device: str | None = None
    precision: str | None = None
    n_params: int | None = None
    pid: int | None = None  # the training process, and when it started (pid reuse)
    heartbeat: float | None = None
    step: int | None = None
    max_steps: int | None = None
    diverged_step: int | None = None
    final: FinalMetrics | None = None
    error: str | None = None
    pid_started: float | None = None
    tags: tuple[str, ...] | None = None  # None: never tagged
    notes: str | None = None
    study_id: int | None = None  # the study the run belongs to, its variant and seed
    variant: str | None = None
    seed: int | None = None
    host: str | None = None  # where the process runs: host name and boot id (core.procs)
    boot_id: str | None = None
    stop_requested: float | None = None  # when a Stop was asked through the store
    parent_id: int | None = None  # a fork or replay: the run it started from, at which step
    fork_step: int | None = None
    fork_kind: str | None = None  # fork | replay
    fork_info: ForkInfo | None = None
    lost: int | None = None  # times lost with its process in a study and queued again

    @classmethod
    def from_row(cls, columns: Sequence[str], row: Sequence[Any]) -> RunRecord:
        """The record of a runs row read as `SELECT <columns>`; JSON columns decoded."""
        values = dict(zip(columns, row, strict=True))
        values["dataset"] = _object(values.get("dataset"))
        # Read as stored (every key kept, none checked): the types say what is written.
        values["config"] = cast(StoredConfig | None, _object(values.get("config")))
        values["final"] = cast(FinalMetrics | None, _object(values.get("final")))
        values["fork_info"] = cast(ForkInfo | None, _object(values.get("fork_info")))
        tags = decode_json(values.get("tags"))
        values["tags"] = tuple(str(t) for t in tags) if isinstance(tags, list) else None
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Every column by name, JSON columns decoded (tags a list): `show --json`'s run."""
        data = {column.name: getattr(self, column.name) for column in fields(self)}
        data["tags"] = None if self.tags is None else list(self.tags)
        return data


@dataclass(frozen=True)
class StudyRecord:
    """One row of the studies table; `spec` and `workers` decoded."""

    id: int
    name: str
    key: str  # the built-in study it runs (core.studies.builtins)
    size: str | None = None
    status: str | None = None  # running | stopped | completed
    created: float | None = None
    ended: float | None = None
    spec: dict[str, Any] = field(default_factory=dict)  # StudyDef.to_spec(); {} when missing
    error: str | None = None
    workers: tuple[tuple[int, float | None], ...] = ()  # (pid, process start time)

    @classmethod
    def from_row(cls, columns: Sequence[str], row: Sequence[Any]) -> StudyRecord:
        """The record of a studies row read as `SELECT <columns>`."""
        values = dict(zip(columns, row, strict=True))
        values["spec"] = _object(values.get("spec")) or {}
        workers = decode_json(values.get("workers"))
        values["workers"] = tuple(
            (int(worker[0]), worker[1])
            for worker in (workers if isinstance(workers, list) else [])
            if isinstance(worker, list) and len(worker) == 2 and isinstance(worker[0], int)
        )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Every column by name, `workers` as [pid, start] lists."""
        data = {column.name: getattr(self, column.name) for column in fields(self)}
        data["workers"] = [list(worker) for worker in self.workers]
        return data
