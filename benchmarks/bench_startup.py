"""How long the dashboard takes to appear and a launched run to show its first loss point.

    .venv/bin/python benchmarks/bench_startup.py [--repeats 3] [--only cold,pages,launch]

Three measurements, each repeated (median and range printed, with the load average):

cold      `streamlit run app.py` on a free port, a fresh chromium (Playwright, /usr/bin/chromium)
          opens it: seconds from starting the server to the Train page's Launch button
          being visible. Beside it the server time of that first script run, measured by a
          proxy: a fresh Python process runs app.py once through Streamlit's AppTest (the
          imports of app.py and the Train page plus one script run; no websocket, no
          browser). `server_s` is that process's import-and-run time, without the
          interpreter's own start.
pages     in the same browser, Train -> Live -> Compare -> Runs -> Parameters through the
          sidebar's links: seconds from the click until the page's title is visible; and
          the server time of the first visit to each page (AppTest, in the fresh process
          above: `switch_page` then one run).
launch    `runner.launch` of the `tiny` preset into a fresh store, polled every 20 ms until
          the first `train/loss` row exists. The run writes a phase trace
          (BLOCKVIZ_STARTUP_TRACE, see blockviz/core/startup_trace.py): interpreter up, torch
          imported, Lightning imported, data loaded, slot claimed, model and Trainer built,
          fit set up; the first step done; the first loss row comes from the store.
          `--threads N` sets OMP_NUM_THREADS for the run (torch's intra-op threads).

The store holds a few fake runs (tests/fakes.py) so Live and Compare draw charts. Not a
test: numbers for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
NAV_PAGES = ("Live", "Compare", "Runs", "Parameters")
APPTEST_PAGES = {
    "Live": "pages/live.py",
    "Compare": "pages/compare.py",
    "Runs": "pages/runs.py",
    "Parameters": "pages/parameters.py",
}

# Run in a fresh interpreter: the server-side proxy for the first page and later pages.
_APPTEST_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("app.py", default_timeout=120)
at.run()
assert not at.exception, at.exception
out = {"server_s": time.perf_counter() - t0}
for title, page in json.loads(sys.argv[1]).items():
    start = time.perf_counter()
    at.switch_page(page)
    at.run()
    assert not at.exception, at.exception
    out[title] = time.perf_counter() - start
print(json.dumps(out))
"""


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _populate(store_path: str) -> None:
    from blockviz.store import RunStore
    from tests import fakes

    with RunStore(store_path) as store:
        fakes.populate(store, n_runs=3, n_steps=1000, n_layer=4, statuses=("completed",))


def _server_times() -> dict[str, float]:
    """First-run and first-visit server times from a fresh process (AppTest proxy)."""
    out = subprocess.run(
        [sys.executable, "-c", _APPTEST_SCRIPT, json.dumps(APPTEST_PAGES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _browser_times() -> dict[str, float]:
    """Cold start to Launch visible, then each later page from click to title."""
    from playwright.sync_api import expect, sync_playwright

    port = _free_port()
    command = [sys.executable, "-m", "streamlit", "run", "app.py"]
    command += ["--server.port", str(port), "--server.headless", "true"]
    times: dict[str, float] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        start = time.perf_counter()
        server = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )
        try:
            while True:  # the browser cannot open the page before the server listens
                try:
                    urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.05)
            times["health_s"] = time.perf_counter() - start
            page.goto(f"http://localhost:{port}/")
            launch = page.get_by_role("button", name="Launch")
            expect(launch).to_be_visible(timeout=60_000)
            times["cold_s"] = time.perf_counter() - start
            for title in NAV_PAGES:
                link = page.get_by_test_id("stSidebarNavLink").filter(has_text=title).first
                clicked = time.perf_counter()
                link.click()
                heading = page.get_by_role("heading", name=title, exact=True).first
                expect(heading).to_be_visible(timeout=60_000)
                times[title] = time.perf_counter() - clicked
        finally:
            browser.close()
            server.terminate()
            server.wait(timeout=20)
    return times


def _launch_times(tmp: Path) -> dict[str, float]:
    """runner.launch of the tiny preset to its first train/loss row, with the phase trace."""
    from blockviz.core import config as cfg
    from blockviz.launch import runner
    from blockviz.store import RunStore

    store_path = tmp / f"launch-{time.time_ns()}.db"
    trace = tmp / f"trace-{time.time_ns()}.txt"
    os.environ["BLOCKVIZ_STARTUP_TRACE"] = str(trace)
    config = cfg.preset("tiny")
    store = RunStore(store_path)
    try:
        start = time.time()
        run_id = runner.launch(config, "bench", store)
        returned = time.time()
        first_loss = None
        while time.time() - start < 120:
            rows = store.scalars(run_id, names="train/loss")
            if len(rows):
                first_loss = time.time()
                break
            if store.get_run(run_id).status not in ("queued", "running"):
                raise RuntimeError(runner.log_tail(store, run_id))
            time.sleep(0.02)
        runner.stop(store, run_id)
        deadline = time.time() + 30
        while store.get_run(run_id).status in ("queued", "running") and time.time() < deadline:
            time.sleep(0.1)
    finally:
        store.close()
        os.environ.pop("BLOCKVIZ_STARTUP_TRACE", None)
    phases = {"launch() returned": returned - start}
    for line in trace.read_text().splitlines() if trace.exists() else []:
        label, stamp = line.rsplit(" ", 1)
        phases[label] = float(stamp) - start
    phases["first train/loss row"] = (first_loss or float("nan")) - start
    return phases


def _summary(samples: list[dict[str, float]]) -> dict[str, str]:
    keys = list(dict.fromkeys(k for sample in samples for k in sample))
    out = {}
    for key in keys:
        values = [s[key] for s in samples if key in s]
        spread = f"({min(values):.2f}-{max(values):.2f}, n={len(values)})"
        out[key] = f"{statistics.median(values):6.2f}  {spread}"
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure, print the medians and ranges, and the raw samples as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="cold,pages,launch")
    parser.add_argument(
        "--threads",
        type=int,
        help="OMP_NUM_THREADS for the launched run (default: torch's own choice)",
    )
    args = parser.parse_args(argv)
    wanted = set(args.only.split(","))
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the launched run
    results: dict[str, list[dict[str, float]]] = {"server": [], "browser": [], "launch": []}
    print(f"load average before: {_load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        os.environ["BLOCKVIZ_STORE"] = str(tmp / "blockviz.db")
        os.chdir(ROOT)
        _populate(os.environ["BLOCKVIZ_STORE"])
        for rep in range(args.repeats):
            if wanted & {"cold", "pages"}:
                results["server"].append(_server_times())
                results["browser"].append(_browser_times())
            if "launch" in wanted:
                results["launch"].append(_launch_times(tmp))
            print(f"repeat {rep + 1}/{args.repeats} done, load {_load()}", flush=True)
    print(f"load average after: {_load()}")
    for name, samples in results.items():
        if samples:
            print(f"\n{name} (s, median (min-max))")
            for key, text in _summary(samples).items():
                print(f"  {key:28s} {text}")
    print("\n" + json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
