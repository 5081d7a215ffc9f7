"""`python -m blockviz ledger list|show|export|import`: the claim ledger from a terminal.

`list` prints a line per claim (each seed set's verdict and the replication, or `not
run`), `show CLAIM` its card, `export` writes the ledger as one offline HTML file and/or
JSON, and `import FILE.json` merges another machine's export into this store's ledger
(kept beside the store: `views.ledger.imports`). A bad file is one line, exit status 2.
Torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from blockviz.cli.runs import open_existing
from blockviz.core import ledger as ldg
from blockviz.core.files import atomic_write
from blockviz.core.flags import UsageError
from blockviz.store import RunStore
from blockviz.views.ledger import build, imports, text

EXIT_OK = 0
STORE_HELP = (
    "run store: a file path or a postgresql:// URL (default $BLOCKVIZ_STORE or runs/blockviz.db)"
)


def build_parser(p: argparse.ArgumentParser) -> None:
    """The `ledger` command's subcommands."""
    sub = p.add_subparsers(dest="ledger_command", metavar="SUBCOMMAND", parser_class=type(p))
    sub.required = True
    listing = sub.add_parser(
        "list", help="one line per claim: each seed set's verdict and the replication"
    )
    show = sub.add_parser("show", help="one claim's card: verdicts, intervals, machine, date")
    show.add_argument("claim", metavar="CLAIM", help="its id (see `ledger list`) or words of it")
    export = sub.add_parser(
        "export", help="the ledger as one self-contained HTML file (opens offline) and/or JSON"
    )
    export.add_argument("--html", metavar="FILE", help="write the offline HTML page here")
    export.add_argument("--json", metavar="FILE", help="write the JSON export here")
    into = sub.add_parser(
        "import",
        help="merge another machine's JSON export into this store's ledger (each entry keeps "
        "where it was measured; the same file twice adds nothing)",
    )
    into.add_argument("file", metavar="FILE.json", help="a `ledger export --json` file")
    for one in (listing, show, export, into):
        one.add_argument("--store", help=STORE_HELP)
    for one in (listing, show):
        one.add_argument("--json", action="store_true", help="print JSON")


def cli_main(args: argparse.Namespace) -> int:
    """Dispatch to the subcommand."""
    handlers = {"list": _list, "show": _show, "export": _export, "import": _import}
    return handlers[args.ledger_command](args)


def _open(args: argparse.Namespace) -> RunStore:
    return open_existing(args.store or None)


def _merged(store: RunStore) -> build.Merged:
    merged = build.merged(store)
    for line in merged.problems:
        print(f"blockviz ledger: {line}", file=sys.stderr)
    return merged


def _list(args: argparse.Namespace) -> int:
    with _open(args) as store:
        entries = _merged(store).entries
    if args.json:
        print(json.dumps([ldg.entry_json(e) for e in entries], indent=2))
        return EXIT_OK
    print("\n".join(text.list_lines(entries)))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    with _open(args) as store:
        entry = ldg.find(_merged(store).entries, args.claim)
    if args.json:
        print(json.dumps(ldg.entry_json(entry), indent=2))
        return EXIT_OK
    print("\n".join(text.card_lines(entry)))
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    if not args.html and not args.json:
        raise UsageError("say what to write: --html FILE, --json FILE or both")
    with _open(args) as store:
        ledger = build.ledger(store)
    if args.json:
        path = _write(args.json, json.dumps(ldg.to_json(ledger), indent=1) + "\n")
        print(f"blockviz: wrote {path} ({len(ledger.entries)} claims)")
    if args.html:
        from blockviz.views.ledger import page

        data = page.ledger_html(ledger)
        path = _write(args.html, data)
        print(f"blockviz: wrote {path} ({len(data.encode()) / 1e6:.1f} MB, opens offline)")
    return EXIT_OK


def _write(where: str, data: str) -> Path:
    path = Path(where).expanduser()
    try:
        atomic_write(path, data)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _import(args: argparse.Namespace) -> int:
    path = Path(args.file).expanduser()
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    with _open(args) as store:
        done = imports.accept(store, imports.read_file(path), str(path))
    if done.already:
        print(f"blockviz: {path} was imported already ({done.path}); nothing added")
        return EXIT_OK
    origin = done.ledger.origin.text()
    print(
        f"blockviz: imported {done.measurements} measurement(s) of {len(done.ledger.entries)} "
        f"claim(s) from {origin}, exported {done.ledger.exported}; kept in {done.path}"
    )
    return EXIT_OK
