"""Run-store writes by concurrent runs, and page times, on SQLite and on PostgreSQL.

    .venv/bin/python benchmarks/bench_store_backends.py [--writers 1,4,8]
        [--sqlite-steps 100000] [--pg-steps 12000] [--repeats 2] [--no-pages]
        [--out benchmarks/results/store-backends.json]

Starts a PostgreSQL server of its own (Debian's binaries, tests/pgserver.py's PgServer) in
a temporary folder on 127.0.0.1 and a free port, with the server's durable defaults
(fsync, synchronous_commit and full_page_writes on; unlike the test server), and always
stops and removes it at the end.

Writers: for each K in --writers, K processes (multiprocessing, spawn), each one run as
training writes it: `RunStore(target, flush_seconds=2.0, defer_when_busy=True)`, one
`create_run`, then N steps in all (N / K each), as fast as they go: per step
8 scalars (`log_scalars`) and `heartbeat(run_id, step)`, and every 10th step a probe's
12 layers x 30 layer statistics (`log_layer_stats`). Rows/s = rows counted in the store
afterwards / wall time from the first write to the last writer's close; the count must
equal the rows written. N is --sqlite-steps on SQLite (a fresh file in a temporary
folder) and --pg-steps on PostgreSQL (a fresh database): about 10-20 s each on a 2-core
box, as the two write at different speeds. Both backends alternate inside each repeat;
each store is removed (the database dropped) once its rows are counted. Each flush's
transaction is timed (the store's own `_flush_once`, wrapped in the writer process); a
flush that finds the store locked (SQLite, `defer_when_busy`) keeps its rows and is
counted as deferred.

Pages: benchmarks/bench_pages.py (Streamlit AppTest) on a store of --page-runs runs x
--page-steps steps x --page-layers layers filled with tests/fakes.py, once on an SQLite
file and once on a fresh PostgreSQL database of the same server, one after the other.

Prints markdown tables and the machine (CPU, cores, load average); saves the numbers to
--out. Not a test: numbers for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import platform
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import pgserver  # noqa: E402  (ROOT is on sys.path)

SCALARS = (
    "train/loss",
    "train/lr",
    "train/grad_norm",
    "train/step_time_s",
    "train/tokens_per_sec",
    "train/elapsed_s",
    "train/tokens",
    "train/epoch",
)
PROBE_EVERY = 10
LAYERS = 12
# 30 (kind, component, stat) records per layer and probe step.
LAYER_RECORDS = [
    ("component", component, stat)
    for component in ("attn_qkv", "attn_out", "ffn_in", "ffn_out", "norm1")
    for stat in ("grad_norm", "param_norm", "update_ratio")
] + [
    ("tap", tap, stat)
    for tap in ("resid_post", "attn_out", "ffn_out")
    for stat in ("mean", "std", "rms", "max_abs", "zero_frac")
]
# What durable means here: the server's defaults, named so the report can show them.
DURABLE = {"listen_addresses": "127.0.0.1", "max_connections": "100"}
SHOWN_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "shared_buffers",
    "max_wal_size",
)


class DurablePgServer(pgserver.PgServer):
    """PgServer without the test flags: fsync, synchronous_commit, full_page_writes as the
    server ships them (on)."""

    def _pg_ctl_start(self) -> None:
        options = ["-p", str(self.port), "-c", f"unix_socket_directories={self.folder}"]
        for name, value in DURABLE.items():
            options += ["-c", f"{name}={value}"]
        start = ["start", "-D", self.data, "-l", self.log, "-w", "-t", "30"]
        self._run("pg_ctl", [*start, "-o", shlex.join(options)], timeout=40)
        self._running = True

    def settings(self) -> dict[str, str]:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            shown = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in SHOWN_SETTINGS}
            shown["version"] = conn.execute("SHOW server_version").fetchone()[0]
        return shown


# ------------------------------------------------------------------------ the writers


def rows_per_writer(steps: int) -> int:
    probes = len(range(0, steps, PROBE_EVERY))
    return steps * len(SCALARS) + probes * LAYERS * len(LAYER_RECORDS)


def writer(target: str, index: int, steps: int, barrier: Any, results: Any) -> None:
    """One run writing `steps` steps as training does; its times go to `results`."""
    from blockviz.store import RunStore

    store = RunStore(target, flush_seconds=2.0, defer_when_busy=True)
    run_id = store.create_run(
        f"writer-{index}",
        {"train": {"max_steps": steps}},
        status="running",
        started=time.time(),
        pid=os.getpid(),
    )
    writes = store.writes
    inner = writes._flush_once
    flushes: list[tuple[float, int]] = []  # (seconds, rows) of each committed flush
    failed: list[float] = []  # seconds of each flush that found the store locked

    def timed_flush() -> None:
        rows = writes._buffered
        start = time.perf_counter()
        try:
            inner()
        except BaseException:
            failed.append(time.perf_counter() - start)
            raise
        flushes.append((time.perf_counter() - start, rows))

    writes._flush_once = timed_flush  # type: ignore[method-assign]
    barrier.wait()
    began = time.monotonic()
    for step in range(steps):
        value = 1.0 / (step + 1)
        store.log_scalars(run_id, [(step, name, value) for name in SCALARS])
        if step % PROBE_EVERY == 0:
            store.log_layer_stats(
                run_id,
                [
                    (step, layer, kind, component, stat, value)
                    for layer in range(LAYERS)
                    for kind, component, stat in LAYER_RECORDS
                ],
            )
        store.heartbeat(run_id, step)
    store.close()
    ended = time.monotonic()
    results.put(
        {
            "run_id": run_id,
            "began": began,
            "ended": ended,
            "rows": rows_per_writer(steps),
            "flushes": flushes,
            "deferred": failed,
        }
    )


def count_rows(target: str) -> tuple[int, int]:
    """Rows in scalars + layer_stats, and the sum of the runs' last heartbeat steps + 1."""
    from blockviz.store import RunStore

    with RunStore(target) as store:
        conn = store.conn
        rows = sum(
            conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            for table in ("scalars", "layer_stats")
        )
        steps = conn.execute("SELECT COALESCE(SUM(step + 1), 0) FROM runs").fetchone()[0]
    return int(rows), int(steps)


def run_writers(target: str, k: int, total_steps: int) -> dict[str, Any]:
    """K writer processes into `target` (already created and empty); the measurement."""
    ctx = mp.get_context("spawn")
    steps = total_steps // k
    barrier = ctx.Barrier(k)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=writer, args=(target, i, steps, barrier, results)) for i in range(k)
    ]
    load = [round(x, 2) for x in os.getloadavg()]
    for proc in procs:
        proc.start()
    done = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    bad = [proc.exitcode for proc in procs if proc.exitcode != 0]
    if bad:
        raise RuntimeError(f"writer exit codes {bad}")
    wall = max(d["ended"] for d in done) - min(d["began"] for d in done)
    written = sum(d["rows"] for d in done)
    counted, stepped = count_rows(target)
    flush_s = [s for d in done for s, _ in d["flushes"]]
    flush_rows = [r for d in done for _, r in d["flushes"]]
    deferred = [s for d in done for s in d["deferred"]]
    return {
        "writers": k,
        "steps_per_writer": steps,
        "rows_written": written,
        "rows_counted": counted,
        "steps_recorded": stepped,
        "wall_s": round(wall, 3),
        "rows_per_s": round(counted / wall),
        "flushes": len(flush_s),
        "flush_rows_median": round(statistics.median(flush_rows)) if flush_rows else None,
        "flush_ms_median": round(statistics.median(flush_s) * 1000, 1) if flush_s else None,
        "flush_ms_p95": round(_quantile(flush_s, 0.95) * 1000, 1) if flush_s else None,
        "flush_ms_max": round(max(flush_s) * 1000, 1) if flush_s else None,
        "deferred_flushes": len(deferred),
        "load_before": load,
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -------------------------------------------------------------------------- the pages


def run_pages(store: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """benchmarks/bench_pages.py on `store` (empty: it fills it); its JSON."""
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_pages.py"), "--store", store]
    command += ["--runs", str(args.page_runs), "--steps", str(args.page_steps)]
    command += ["--layers", str(args.page_layers), "--repeats", str(args.page_repeats)]
    command += ["--json", str(out)]
    print(f"$ {shlex.join(command)}", flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return json.loads(out.read_text())


# ---------------------------------------------------------------------------- machine


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def code() -> dict[str, Any]:
    """The commit and a digest of blockviz/store/*.py as measured (the tree may differ from
    the commit while others work in it)."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "blockviz" / "store").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "diff", "--name-only", "HEAD", "--", "blockviz"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.split()
    except OSError:
        head, changed = "", []
    return {"commit": head, "changed": changed, "store_sha256": digest.hexdigest()[:12]}


def machine() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", default="1,4,8", help="writer counts, comma-separated")
    parser.add_argument(
        "--sqlite-steps", type=int, default=100000, help="SQLite: steps split over the writers"
    )
    parser.add_argument(
        "--pg-steps", type=int, default=12000, help="PostgreSQL: steps split over the writers"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-pages", action="store_true", help="skip the page times")
    parser.add_argument("--no-writers", action="store_true", help="skip the writers")
    parser.add_argument("--page-runs", type=int, default=20)
    parser.add_argument("--page-steps", type=int, default=5000)
    parser.add_argument("--page-layers", type=int, default=12)
    parser.add_argument("--page-repeats", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/store-backends.json"))
    args = parser.parse_args(argv)
    counts = [int(k) for k in args.writers.split(",")]

    result: dict[str, Any] = {"machine": machine(), "command": shlex.join(sys.argv)}
    result["code"] = code()
    print(f"machine: {result['machine']}", flush=True)
    server = DurablePgServer()
    tmp = Path(tempfile.mkdtemp(prefix="bench-backends-"))
    try:
        result["postgresql"] = server.settings()
        print(f"postgresql: {result['postgresql']}", flush=True)

        def remove(target: str) -> None:
            if target.startswith("postgresql://"):
                server.drop_database(target.split("?", 1)[0])
            else:
                for suffix in ("", "-wal", "-shm"):
                    Path(target + suffix).unlink(missing_ok=True)

        def fresh(backend: str) -> str:
            if backend == "sqlite":
                return str(tmp / f"{uuid.uuid4().hex[:8]}.db")
            url = server.create_database()
            return f"{url}?runs={tmp / url.rsplit('/', 1)[1]}"

        writes: list[dict[str, Any]] = []
        if not args.no_writers:
            for repeat in range(1, args.repeats + 1):
                for k in counts:
                    for backend in ("sqlite", "postgresql"):
                        target = fresh(backend)
                        from blockviz.store import RunStore

                        RunStore(target).close()  # the schema, before the clock starts
                        one = {"backend": backend, "repeat": repeat}
                        one["at"] = time.strftime("%H:%M:%S")
                        steps = args.sqlite_steps if backend == "sqlite" else args.pg_steps
                        one.update(run_writers(target, k, steps))
                        writes.append(one)
                        print(json.dumps(one), flush=True)
                        if one["rows_counted"] != one["rows_written"]:
                            print(f"LOST ROWS: {one}", flush=True)
                        remove(target)
        result["writes"] = writes

        pages: dict[str, Any] = {}
        if not args.no_pages:
            for backend in ("sqlite", "postgresql"):
                pages[backend] = run_pages(fresh(backend), args, tmp / f"pages-{backend}.json")
        result["pages"] = pages
    finally:
        server.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if code() != result["code"]:
        result["code_changed_during_run"] = code()
        print(f"NOTE: blockviz/store changed during the run: {result['code']} -> {code()}")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    report(result)
    print(f"\nsaved {out}")
    return 0


def report(result: dict[str, Any]) -> None:
    """The markdown tables."""
    m, pg = result["machine"], result.get("postgresql", {})
    print(
        f"\n{m['cpu']}, {m['cores']} cores, {m['platform']}, python {m['python']}, "
        f"SQLite {m['sqlite']}, PostgreSQL {pg.get('version')} (fsync {pg.get('fsync')}, "
        f"synchronous_commit {pg.get('synchronous_commit')}, full_page_writes "
        f"{pg.get('full_page_writes')}); {m['date']}; load average before "
        f"{m['load_before']}, after {m['load_after']}; code {result['code']}\n"
    )
    writes = result.get("writes") or []
    if writes:
        print("| writers | SQLite rows/s | PostgreSQL rows/s | PG / SQLite |")
        print("|---|---|---|---|")
        for k in sorted({w["writers"] for w in writes}):

            def rates(backend: str, k: int = k) -> list[int]:
                return [
                    w["rows_per_s"] for w in writes if w["writers"] == k and w["backend"] == backend
                ]

            lite, pg_rates = rates("sqlite"), rates("postgresql")
            ratio = ", ".join(f"{p / s:.2f}" for s, p in zip(lite, pg_rates, strict=False))
            print(
                f"| {k} | {', '.join(f'{r:,}' for r in lite)} | "
                f"{', '.join(f'{r:,}' for r in pg_rates)} | {ratio} |"
            )
        print()
        print(
            "| backend | writers | repeat | rows | wall s | rows/s | flushes | rows/flush | "
            "flush ms median | p95 | max | deferred |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for w in writes:
            print(
                f"| {w['backend']} | {w['writers']} | {w['repeat']} | {w['rows_counted']:,} | "
                f"{w['wall_s']:.1f} | {w['rows_per_s']:,} | {w['flushes']} | "
                f"{w['flush_rows_median']} | {w['flush_ms_median']} | {w['flush_ms_p95']} | "
                f"{w['flush_ms_max']} | {w['deferred_flushes']} |"
            )
    pages = result.get("pages") or {}
    if len(pages) == 2:
        lite, pg_pages = pages["sqlite"], pages["postgresql"]
        print(
            f"\nfill: SQLite {lite['filled_s']:.1f} s, PostgreSQL {pg_pages['filled_s']:.1f} s "
            f"({lite['shape']})\n"
        )
        print(
            "| page | SQLite warm s | PostgreSQL warm s | PG / SQLite | first s SQLite, PG "
            "| charts SQLite, PG |"
        )
        print("|---|---|---|---|---|---|")
        for a, b in zip(lite["pages"], pg_pages["pages"], strict=True):
            print(
                f"| {a['page']} | {a['warm_median_s']:.3f} | {b['warm_median_s']:.3f} | "
                f"{b['warm_median_s'] / a['warm_median_s']:.2f} | {a['first_s']:.3f}, "
                f"{b['first_s']:.3f} | {a['charts']}, {b['charts']} |"
            )


if __name__ == "__main__":
    raise SystemExit(main())
