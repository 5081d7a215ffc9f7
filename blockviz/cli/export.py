"""`python -m blockviz export RUN ... --out DIR`: charts, data and a report, or code, headless."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from blockviz.store import RunStore, checked
from blockviz.views.export.codegen import export_code_to_folder
from blockviz.views.export.folder import export_to_folder


def cli_main(args: argparse.Namespace) -> int:
    """`python -m blockviz export RUN [RUN ...] --out DIR --format ...`: write, then list."""
    # Read-only, and a damaged store is refused rather than half exported.
    store = checked(RunStore(args.store or None, readonly=True))
    try:
        started = time.perf_counter()
        if args.format == "code":
            written = export_code_to_folder(store, args.runs, Path(args.out))
        else:
            written = export_to_folder(store, args.runs, Path(args.out), args.format)
    finally:
        store.close()
    for path in written:
        print(path)
    print(f"wrote {len(written)} files in {time.perf_counter() - started:.1f} s")
    return 0
