"""Ledger exports imported into a store: a folder of checked JSON beside the store.

`<store file>.ledger/` (a server store: `<workspace>/ledger/`) holds one file per imported
export, `<sha256 prefix>.json`, written from the parsed ledger (`core.ledger.parse`, then
`to_json`), never the bytes as they came: only the fields blockviz reads are kept, and the
name is the hash of that canonical form, so the same export imported twice is one file.
Why a folder and not a table: an import is another machine's document, not this store's
runs; a table would be a schema change (a version every older blockviz refuses to write)
for data nothing joins against, while a folder is read as a whole and can be inspected
or removed by hand. The CLI (`ledger import`) and the Ledger page's uploader both go
through `accept`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from blockviz.core import ledger as ldg
from blockviz.core.files import atomic_write
from blockviz.store import RunStore


@dataclass(frozen=True)
class Imported:
    """What an import did: the file it keeps, whether it was there already, the ledger."""

    path: Path
    already: bool
    ledger: ldg.Ledger
    measurements: int  # measurements the file holds


def _canonical(ledger: ldg.Ledger) -> bytes:
    return (json.dumps(ldg.to_json(ledger), sort_keys=True, indent=1) + "\n").encode()


def accept(store: RunStore, data: bytes, name: str) -> Imported:
    """Check an export's bytes and keep it beside the store; LedgerError (one line) for a
    file that is not a ledger export, or a folder that cannot be written."""
    ledger = ldg.parse(data, name)
    canonical = _canonical(ledger)
    path = store.ledger_root / f"{hashlib.sha256(canonical).hexdigest()[:16]}.json"
    already = path.is_file()
    if not already:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, canonical)
        except OSError as exc:
            raise ldg.LedgerError(f"cannot keep the import in {path.parent}: {exc}") from None
    count = sum(len(e.measurements) for e in ledger.entries)
    return Imported(path, already, ledger, count)


def read_file(path: Path) -> bytes:
    """A file's bytes, at most one past the size limit (so `parse` can say it is too large
    without reading all of it); LedgerError when it cannot be read."""
    try:
        with path.open("rb") as handle:
            return handle.read(ldg.MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ldg.LedgerError(f"cannot read {path}: {exc.strerror or exc}") from None


def imported(store: RunStore) -> tuple[list[ldg.Ledger], list[str]]:
    """The imported ledgers, oldest export first (so a newer one of the same origin wins
    in `core.ledger.merge`), and a line for each file in the folder that no longer reads."""
    folder = store.ledger_root
    ledgers, problems = [], []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            ledgers.append(ldg.parse(read_file(path), str(path)))
        except ldg.LedgerError as exc:
            problems.append(f"left out: {exc}")
    ledgers.sort(key=lambda led: led.exported)
    return ledgers, problems
