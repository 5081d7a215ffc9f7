"""The claim ledger's entries, their JSON form, and merging ledgers from several machines.

A ledger has one **entry** per named claim (a claim of a built-in study: its sentence, its
source, its study). An entry holds one **measurement** per stored definition of its study
(`studies.replication.definition`: the spec without the seeds) in one store: every seed
set's verdict with its reason and intervals, where and when it was measured, the
replication state across the sets, and the one command that runs the definition again on
fresh seeds. A claim no store has measured has no measurement: it is "not run", and its
entry carries the command that runs it.

Each measurement keeps its **origin**, the host and store it was read from, so a ledger
exported on one machine and imported on another says where each number came from; two
measurements of the same origin and first study are one (`merge` keeps the newer).
The JSON form (`to_json`, `parse`) is the export and import format: `parse` reads bytes
that came from anywhere, bounded in size and checked field by field, and raises
`LedgerError` with one line naming the first field that is wrong. Torch-free and
store-free: `views.ledger` reads the store.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from blockviz.core.studies import replication as rep
from blockviz.core.studies.rules.base import VERDICTS

FORMAT = "blockviz-ledger"
VERSION = 1
MAX_FILE_BYTES = 8 * 2**20  # an export of every built-in at several sizes is far smaller
MAX_TEXT = 4000  # characters of one string (a reason with its intervals fits)
MAX_ITEMS = 5000  # items of one list (a sweep's points: 28 variants x 20 seeds x sets)
NOT_RUN = "not run"
STATES = (rep.REPLICATED, rep.NOT_REPLICATED, rep.PENDING, rep.NO_SECOND_SET, rep.NO_RUNS)


class LedgerError(ValueError):
    """A ledger file that cannot be read: the message names the field and what is wrong."""


@dataclass(frozen=True)
class Origin:
    """Where a measurement was read: the exporting host and its store (a path, or a server
    URL without its password)."""

    host: str
    store: str

    def text(self) -> str:
        return f"{self.store} on {self.host}"


@dataclass(frozen=True)
class SeedSetResult:
    """One stored study (a seed set) of a definition: the claim's verdict on its own runs,
    and where and when they ran, as far as the store recorded it."""

    study: int  # the study's id in its store
    seeds: tuple[int, ...]
    verdict: str  # supported | contradicted | inconclusive | pending
    reason: str
    intervals: tuple[str, ...]
    runs: int
    unfinished: int  # runs without an outcome (queued, running, stopped, failed)
    hosts: tuple[str, ...]  # the host names its runs recorded
    devices: tuple[str, ...]  # the device texts its runs recorded (`cpu, 1 thread`)
    unrecorded: int  # runs that recorded no host
    date: str | None  # the UTC date the study ended, else the one it was created
    # A claim judged across learning rates: each setting's LR sensitivity and best loss,
    # with their intervals, one line a setting (`views.studies.table.sensitivity_display`).
    sensitivity: tuple[str, ...] = ()

    def machine(self) -> str:
        """`host box1: cpu, 1 thread`, saying what the store did not record."""
        hosts = ", ".join(self.hosts) if self.hosts else "not recorded"
        devices = "; ".join(self.devices) if self.devices else "device not recorded"
        text = f"host {hosts}: {devices}"
        if self.hosts and self.unrecorded:
            text += f" ({self.unrecorded} of {self.runs} runs recorded no host)"
        return text


@dataclass(frozen=True)
class Point:
    """One finished run of a swept claim: its value of the swept field, its group (the
    claim's side or another setting), its final val loss (None: not finite) and outcome."""

    study: int
    seed: int
    x: float
    group: str
    val_loss: float | None
    outcome: str


@dataclass(frozen=True)
class Measurement:
    """One definition of the claim's study in one store: its seed sets, their replication,
    the command that runs it again and, for a claim judged across a swept field, the
    points its chart draws."""

    origin: Origin
    size: str
    variants: int  # the grid: variants (each set runs every one on each of its seeds)
    swept: tuple[str, ...]  # the fields the variants set
    replication: str
    replication_reason: str
    sets: tuple[SeedSetResult, ...]
    rerun: str | None  # None: no command re-runs this definition (a built-in changed since)
    field: str | None = None
    points: tuple[Point, ...] = ()

    def grid(self) -> str:
        """`21 variants (lr × norm_position) × each set's seeds`."""
        fields = f" ({' × '.join(self.swept)})" if self.swept else ""
        return f"{self.variants} variants{fields} × each set's seeds"

    def identity(self) -> tuple[str, str, str, int | None]:
        """What makes two measurements one: the origin and its first (oldest) study, which
        a later seed set of the same definition keeps."""
        first = self.sets[0].study if self.sets else None
        return (self.origin.host, self.origin.store, self.size, first)


@dataclass(frozen=True)
class Entry:
    """One named claim and every measurement of it."""

    id: str  # `<study key>-<n>`: the claim's place among its study's claims
    claim: str
    source: str
    rule: str
    study_key: str
    study_title: str
    run_command: str  # runs it at the quick size (what a claim not run yet offers)
    measurements: tuple[Measurement, ...] = ()

    @property
    def state(self) -> str:
        """The newest measurement's replication state, or `not run`."""
        return self.measurements[-1].replication if self.measurements else NOT_RUN


@dataclass(frozen=True)
class Ledger:
    """Entries as exported from one store on one host at one time."""

    exported: str  # ISO 8601, UTC
    origin: Origin
    entries: tuple[Entry, ...]


def claim_id(study_key: str, index: int) -> str:
    """`activation-1`: the first claim of the activation study."""
    return f"{study_key}-{index + 1}"


def find(entries: Sequence[Entry], text: str) -> Entry:
    """The entry whose id is `text`, else the one whose claim contains it (any case);
    LedgerError naming the choices when none or several match."""
    wanted = text.strip().lower()
    for entry in entries:
        if entry.id == wanted:
            return entry
    found = [e for e in entries if wanted and wanted in e.claim.lower()]
    if len(found) == 1:
        return found[0]
    if found:
        ids = ", ".join(e.id for e in found)
        raise LedgerError(f"{text!r} matches {len(found)} claims ({ids}); give one id")
    raise LedgerError(f"no claim {text!r}; `ledger list` shows each claim's id")


# ---------------------------------------------------------------------------- merging


def merge(base: Sequence[Entry], others: Iterable[Sequence[Entry]]) -> list[Entry]:
    """`base`'s entries (in order) with every other ledger's measurements added to the
    entry of the same study and claim sentence; an entry no base has is appended. A
    measurement already there (same origin and first study) is kept once: the later one wins,
    so importing a newer export of one store updates it and the same file twice adds
    nothing."""
    merged = {(e.study_key, e.claim): e for e in base}
    for entries in others:
        for entry in entries:
            key = (entry.study_key, entry.claim)
            if key not in merged:
                merged[key] = replace(
                    entry, id=_free_id(entry.id, merged.values()), measurements=()
                )
            held = merged[key]
            kept = {m.identity(): m for m in held.measurements}
            for measurement in entry.measurements:
                kept[measurement.identity()] = measurement
            merged[key] = replace(held, measurements=tuple(kept.values()))
    return list(merged.values())


def _free_id(wanted: str, entries: Iterable[Entry]) -> str:
    """`wanted`, or `wanted.2`, `wanted.3`... when another entry has it (an older version
    of a study whose claims differ from today's)."""
    taken = {e.id for e in entries}
    candidate, n = wanted, 1
    while candidate in taken:
        n += 1
        candidate = f"{wanted}.{n}"
    return candidate


# ------------------------------------------------------------------------ JSON: write


def to_json(ledger: Ledger) -> dict[str, Any]:
    """The export: plain JSON (no NaN), read back by `parse`."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported": ledger.exported,
        "origin": _origin_json(ledger.origin),
        "entries": [entry_json(e) for e in ledger.entries],
    }


def _origin_json(origin: Origin) -> dict[str, str]:
    return {"host": origin.host, "store": origin.store}


def entry_json(entry: Entry) -> dict[str, Any]:
    """One entry as the export holds it (`ledger show --json`)."""
    return {
        "id": entry.id,
        "claim": entry.claim,
        "source": entry.source,
        "rule": entry.rule,
        "study": {"key": entry.study_key, "title": entry.study_title},
        "run_command": entry.run_command,
        "measurements": [_measurement_json(m) for m in entry.measurements],
    }


def _measurement_json(m: Measurement) -> dict[str, Any]:
    return {
        "origin": _origin_json(m.origin),
        "size": m.size,
        "variants": m.variants,
        "swept": list(m.swept),
        "replication": {"state": m.replication, "reason": m.replication_reason},
        "rerun": m.rerun,
        "sets": [
            {
                "study": s.study,
                "seeds": list(s.seeds),
                "verdict": s.verdict,
                "reason": s.reason,
                "intervals": list(s.intervals),
                "runs": s.runs,
                "unfinished": s.unfinished,
                "hosts": list(s.hosts),
                "devices": list(s.devices),
                "unrecorded": s.unrecorded,
                "date": s.date,
                "sensitivity": list(s.sensitivity),
            }
            for s in m.sets
        ],
        "field": m.field,
        "points": [
            {
                "study": p.study,
                "seed": p.seed,
                "x": p.x,
                "group": p.group,
                "val_loss": p.val_loss,
                "outcome": p.outcome,
            }
            for p in m.points
        ],
    }


# ------------------------------------------------------------------------- JSON: read


def parse(data: bytes, name: str = "the file") -> Ledger:
    """A ledger from an export's bytes; LedgerError (one line) for anything else: too
    large, not UTF-8 JSON, another format or version, a field missing or of the wrong
    type, a string or list over its bound, a number that is not finite."""
    if len(data) > MAX_FILE_BYTES:
        raise LedgerError(
            f"{name} is larger than a ledger export's limit of {MAX_FILE_BYTES // 2**20} MiB"
        )
    try:
        document = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise LedgerError(f"{name} is not UTF-8 text, so not a ledger export") from None
    except RecursionError:
        raise LedgerError(f"{name} nests deeper than a ledger export does") from None
    except ValueError as exc:
        raise LedgerError(f"{name} is not JSON ({exc}), so not a ledger export") from None
    try:
        return _ledger(document)
    except _Bad as exc:
        raise LedgerError(f"{name} is not a ledger export blockviz reads: {exc}") from None


class _Bad(Exception):
    """A field that is wrong; the path and what was expected."""


def _no_constant(word: str) -> float:
    raise ValueError(f"{word} is not a number JSON allows")


def _get(obj: Any, path: str, key: str) -> Any:
    if not isinstance(obj, Mapping):
        raise _Bad(f"{path or 'the top level'}: expected an object")
    if key not in obj:
        raise _Bad(f"{path}.{key}: missing" if path else f"{key}: missing")
    return obj[key]


def _text(obj: Any, path: str, key: str, optional: bool = False) -> str | None:
    value = _get(obj, path, key)
    where = f"{path}.{key}" if path else key
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _Bad(f"{where}: expected text")
    if len(value) > MAX_TEXT:
        raise _Bad(f"{where}: {len(value):,} characters, more than {MAX_TEXT:,}")
    return value


def _word(obj: Any, path: str, key: str, allowed: Sequence[str]) -> str:
    value = _text(obj, path, key)
    if value not in allowed:
        raise _Bad(f"{path}.{key}: {_shown(value)} is not one of {', '.join(allowed)}")
    return str(value)


def _whole(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**53:
        raise _Bad(f"{where}: expected a whole number from 0, not {_shown(value)}")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad(f"{where}: expected a finite number, not {_shown(value)}")
    return float(value)


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _items(obj: Any, path: str, key: str) -> list[Any]:
    value = _get(obj, path, key)
    where = f"{path}.{key}" if path else key
    if not isinstance(value, list):
        raise _Bad(f"{where}: expected a list")
    if len(value) > MAX_ITEMS:
        raise _Bad(f"{where}: {len(value):,} items, more than {MAX_ITEMS:,}")
    return value


def _each(obj: Any, path: str, key: str, read: Callable[[Any, str], Any]) -> tuple[Any, ...]:
    where = f"{path}.{key}" if path else key
    return tuple(read(item, f"{where}[{i}]") for i, item in enumerate(_items(obj, path, key)))


def _ledger(document: Any) -> Ledger:
    if _get(document, "", "format") != FORMAT:
        raise _Bad(f"format: expected {FORMAT!r}")
    version = _get(document, "", "version")
    if version != VERSION:
        raise _Bad(f"version: {_shown(version)}; this blockviz reads version {VERSION}")
    entries = _each(document, "", "entries", _entry)
    ids = [(e.study_key, e.claim) for e in entries]
    if len(set(ids)) != len(ids):
        raise _Bad("entries: a claim appears twice")
    return Ledger(
        str(_text(document, "", "exported")),
        _origin(_get(document, "", "origin"), "origin"),
        entries,
    )


def _origin(obj: Any, path: str) -> Origin:
    return Origin(str(_text(obj, path, "host")), str(_text(obj, path, "store")))


def _entry(obj: Any, path: str) -> Entry:
    said = [str(_text(obj, path, key)) for key in ("id", "claim", "source", "rule")]
    study = _get(obj, path, "study")
    return Entry(
        *said,
        study_key=str(_text(study, f"{path}.study", "key")),
        study_title=str(_text(study, f"{path}.study", "title")),
        run_command=str(_text(obj, path, "run_command")),
        measurements=_each(obj, path, "measurements", _measurement),
    )


def _measurement(obj: Any, path: str) -> Measurement:
    replication = _get(obj, path, "replication")
    where = f"{path}.replication"
    return Measurement(
        origin=_origin(_get(obj, path, "origin"), f"{path}.origin"),
        size=str(_text(obj, path, "size")),
        variants=_whole(_get(obj, path, "variants"), f"{path}.variants"),
        swept=_texts(obj, path, "swept"),
        replication=_word(replication, where, "state", STATES),
        replication_reason=str(_text(replication, where, "reason")),
        sets=_each(obj, path, "sets", _seed_set),
        rerun=_text(obj, path, "rerun", optional=True),
        field=_text(obj, path, "field", optional=True),
        points=_each(obj, path, "points", _point),
    )


def _texts(obj: Any, path: str, key: str) -> tuple[str, ...]:
    items = _items(obj, path, key)
    return tuple(str(_text({key: v}, f"{path}.{key}[{i}]", key)) for i, v in enumerate(items))


def _seed_set(obj: Any, path: str) -> SeedSetResult:
    seeds = _items(obj, path, "seeds")
    return SeedSetResult(
        study=_whole(_get(obj, path, "study"), f"{path}.study"),
        seeds=tuple(_whole(s, f"{path}.seeds[{i}]") for i, s in enumerate(seeds)),
        verdict=_word(obj, path, "verdict", VERDICTS),
        reason=str(_text(obj, path, "reason")),
        intervals=_texts(obj, path, "intervals"),
        runs=_whole(_get(obj, path, "runs"), f"{path}.runs"),
        unfinished=_whole(_get(obj, path, "unfinished"), f"{path}.unfinished"),
        hosts=_texts(obj, path, "hosts"),
        devices=_texts(obj, path, "devices"),
        unrecorded=_whole(_get(obj, path, "unrecorded"), f"{path}.unrecorded"),
        date=_text(obj, path, "date", optional=True),
        sensitivity=_texts(obj, path, "sensitivity"),
    )


def _point(obj: Any, path: str) -> Point:
    return Point(
        study=_whole(_get(obj, path, "study"), f"{path}.study"),
        seed=_whole(_get(obj, path, "seed"), f"{path}.seed"),
        x=_number(_get(obj, path, "x"), f"{path}.x"),
        group=str(_text(obj, path, "group")),
        val_loss=None
        if (loss := _get(obj, path, "val_loss")) is None
        else _number(loss, f"{path}.val_loss"),
        outcome=str(_text(obj, path, "outcome")),
    )
