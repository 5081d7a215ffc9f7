"""Take the screenshots of README and docs/ from the real app, the way a user gets there.

    .venv/bin/python docs/screenshots/take.py [--steps 2000] [--out docs/screenshots]
                                              [--size 1440x1000] [--all-tabs]

Serves app.py on a free local port with a fresh store in a temporary workspace, then
drives Debian's chromium (/usr/bin/chromium) with Playwright through issue 5's "done when":
a Pre-LN run launched from the sidebar, Norm position flipped to post, a second launch,
both watched on Live, then compared; then the Playground in a fresh session, at its own
default (the `playground` preset): Auto-run on, Norm position flipped to post beside the
chart, both auto-runs' losses.
Writes train.png, live.png, compare.png and playground.png (README shows the 1440-px ones;
`--size 1366x768 --out DIR` takes a laptop set to look at; `--playground-only` the last).
`--findings-only` trains README's three starter runs from the command line, as its table
gives them, and writes findings.png: Live on the Post-LN one, its findings at the top, after
a click on the newest finding's Show (gradients vanish: the Gradients tab, step 50 marked).
`--studies-only` runs the quick norm-position study with one click on the Studies page and
writes studies.png (claims beside verdicts) and study-chart.png (its loss curves by variant).
Needs no network; takes a few minutes on a 2-core CPU (the runs take turns there).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
VIEWPORT = {"width": 1440, "height": 1000}  # --size changes it
TRAIN_HEIGHT = 1500  # down to the runs in progress
COMPARE_HEIGHT = 2100  # down to the config diff


def _active_runs() -> int:
    """Runs of this script's store still queued or running."""
    from blockviz.core.spec import ACTIVE_STATUSES
    from blockviz.store import RunStore

    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        return int(store.runs_frame()["status"].isin(ACTIVE_STATUSES).sum())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"the app did not answer on port {port} within {timeout_s:.0f} s")


def _scroll_to_top(page) -> None:
    """Blur the last field typed in and scroll the sidebar back up (typing scrolled it)."""
    _blur(page)
    page.evaluate(
        "document.querySelectorAll('[data-testid=stSidebarContent], [data-testid=stMain]')"
        ".forEach(e => e.scrollTop = 0)"
    )


def _blur(page) -> None:
    """No focus ring (the theme's red, which reads as an error) on the last box used."""
    page.evaluate("document.activeElement && document.activeElement.blur()")


def _settled(page) -> None:
    """Wait until no element is drawn stale (Streamlit fades one while its rerun is under
    way, a redraw a loaded machine can make last seconds)."""
    page.wait_for_function("!document.querySelector('[data-stale=\"true\"]')", timeout=60_000)


def _set_number(sidebar, label: str, value: int) -> None:
    box = sidebar.get_by_role("spinbutton", name=label)
    box.fill(str(value))
    box.press("Enter")


def _launch(main, name: str, run_id: int) -> None:
    """Press Launch once the page has redrawn with the sidebar's new name (a click during
    the redraw is lost), then wait for the run's confirmation."""
    from playwright.sync_api import expect

    expect(main.locator("code").get_by_text(name, exact=True)).to_be_visible()
    main.locator(".st-key-launch button").click()
    expect(main.get_by_text(f"Launched run #{run_id}")).to_be_visible()


def _shoot(page, url: str, out: Path, steps: int, all_tabs: bool) -> None:
    from playwright.sync_api import expect

    page.goto(url)
    sidebar = page.get_by_test_id("stSidebar")
    main = page.get_by_test_id("stMain")
    nav = sidebar.get_by_test_id("stSidebarNav")

    # A Pre-LN run of a smaller baby-cpu: 4 layers, d_model 64.
    _set_number(sidebar, "Width (d_model)", 64)
    sidebar.get_by_text("Training", exact=True).click()
    _set_number(sidebar, "Steps (max_steps)", steps)
    sidebar.get_by_role("textbox", name="Run name").fill("pre-ln")
    sidebar.get_by_role("textbox", name="Run name").press("Enter")
    _launch(main, "pre-ln", 1)

    # The same with the norms after the residual adds.
    sidebar.get_by_role("combobox", name="Norm position").click()
    page.get_by_role("option", name="post", exact=True).click()
    sidebar.get_by_role("textbox", name="Run name").fill("post-ln")
    sidebar.get_by_role("textbox", name="Run name").press("Enter")
    _launch(main, "post-ln", 2)
    page.wait_for_timeout(8000)  # run #1 under way: progress bar and ETA
    _scroll_to_top(page)
    page.set_viewport_size({"width": VIEWPORT["width"], "height": TRAIN_HEIGHT})
    page.wait_for_timeout(2000)
    _settled(page)
    page.screenshot(path=out / "train.png")
    page.set_viewport_size(VIEWPORT)

    nav.get_by_text("Live", exact=True).click()
    sidebar.get_by_role("combobox", name="Run").first.click()
    page.get_by_role("option", name="#1 pre-ln", exact=False).click()
    expect(main.get_by_test_id("stVegaLiteChart").first).to_be_visible(timeout=60_000)
    page.wait_for_timeout(6000)
    _blur(page)
    _settled(page)
    page.screenshot(path=out / "live.png")
    if all_tabs:  # for reviewing the other tabs; the README shows the first
        page.set_viewport_size({"width": VIEWPORT["width"], "height": COMPARE_HEIGHT})
        for tab in ("Gradients", "Activations", "Updates", "Attention", "Samples"):
            main.get_by_role("tab", name=tab).click()
            page.wait_for_timeout(4000)
            page.screenshot(path=out / f"live-{tab.lower()}.png")
        main.get_by_role("tab", name="Loss").click()
        page.set_viewport_size(VIEWPORT)

    # Both finished (on a small machine they take turns), then Compare.
    deadline = time.monotonic() + 900
    while _active_runs() and time.monotonic() < deadline:
        page.wait_for_timeout(2000)
    nav.get_by_text("Compare", exact=True).click()
    expect(main.get_by_text("Final metrics", exact=True)).to_be_visible()
    # Streamlit scrolls inside its own container, so a full-page shot needs a tall window.
    page.set_viewport_size({"width": VIEWPORT["width"], "height": COMPARE_HEIGHT})
    page.wait_for_timeout(5000)
    _settled(page)
    page.screenshot(path=out / "compare.png")
    page.set_viewport_size(VIEWPORT)

    _playground(page, url, out)


def _playground(page, url: str, out: Path) -> None:
    """A fresh session on the Playground at its default (the `playground` preset, as a new
    user meets it): Auto-run on, then Norm position flipped to post beside the chart; both
    auto-runs' losses drawn without pressing Launch."""
    from playwright.sync_api import expect

    from blockviz.core.presets import PLAYGROUND_PRESET

    expect.set_options(timeout=120_000)  # a replaced auto-run stops before the next starts
    page.set_viewport_size(VIEWPORT)
    page.goto(f"{url}/playground")
    main = page.get_by_test_id("stMain")
    main.get_by_text("Auto-run", exact=True).click()
    try:
        # The first auto-run trains to its end (under a minute on a loaded 2-core box).
        start = main.get_by_text(f" start: {PLAYGROUND_PRESET} (newest) · completed", exact=False)
        expect(start).to_be_visible(timeout=600_000)
        main.get_by_role("combobox", name="Norm position").click()
        page.get_by_role("option", name="post", exact=True).click()
        expect(main.get_by_text("norm_position: pre → post", exact=False).first).to_be_visible()
    except AssertionError:
        page.screenshot(path=out / "playground-failed.png", full_page=True)
        raise
    deadline = time.monotonic() + 600
    while _active_runs() and time.monotonic() < deadline:
        page.wait_for_timeout(2000)
    page.wait_for_timeout(3000)
    page.mouse.move(0, 0)  # no tooltip over the shot
    _blur(page)
    page.wait_for_timeout(2000)
    _settled(page)
    page.screenshot(path=out / "playground.png")


STUDY = "norm-position"  # six variants in three families: lines that must be told apart
STUDY_HEIGHT = 1400  # the claims and verdicts, the results table


def _active_studies() -> int:
    """Studies of this script's store still running."""
    from blockviz.store import RunStore

    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        return int((store.studies_frame()["status"] == "running").sum())


def _studies(page, url: str, out: Path) -> None:
    """One click on the Studies page: the quick norm-position study, run to its end; then
    studies.png (its claims and verdicts) and study-chart.png (its loss curves by variant,
    at the window's size)."""
    from playwright.sync_api import expect

    page.set_viewport_size(VIEWPORT)
    page.goto(f"{url}/studies")
    main = page.get_by_test_id("stMain")
    main.get_by_role("combobox", name="Study").click()
    page.get_by_role("option", name=f"{STUDY} —", exact=False).click()
    main.get_by_role("button", name="Run study").click()
    expect(main.get_by_text("Started study #1", exact=False)).to_be_visible()
    deadline = time.monotonic() + 1800
    while _active_studies() and time.monotonic() < deadline:
        page.wait_for_timeout(3000)
    page.reload()  # the finished study, drawn once
    chart = main.get_by_test_id("stVegaLiteChart").first
    expect(chart).to_be_visible(timeout=120_000)
    page.wait_for_timeout(4000)
    page.mouse.move(0, 0)
    page.set_viewport_size({"width": VIEWPORT["width"], "height": STUDY_HEIGHT})
    page.wait_for_timeout(3000)
    _settled(page)
    page.screenshot(path=out / "studies.png")
    page.set_viewport_size(VIEWPORT)
    chart.scroll_into_view_if_needed()
    chart.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(2000)
    _settled(page)
    page.screenshot(path=out / "study-chart.png")


FINDINGS_HEIGHT = 1950  # the findings, then the Gradients tab's charts


def _train_starters() -> None:
    """README's three starter runs, from the command line as its table gives them (the
    rows `benchmarks/starter_runs.py` checks, names included), into this script's store."""
    from benchmarks.starter_runs import STARTERS

    for starter in STARTERS:
        if starter.command != ("train",):
            continue  # the fork of the second: README's next section, not its table
        command = [sys.executable, "-m", "blockviz", "train", *starter.flags, "--no_progress"]
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=900)


def _findings(page, url: str, out: Path) -> None:
    """Live on the Post-LN starter (run #2): the headline and findings, then a Show."""
    from playwright.sync_api import expect

    page.set_viewport_size({"width": VIEWPORT["width"], "height": FINDINGS_HEIGHT})
    page.goto(f"{url}/live?run=2")
    main = page.get_by_test_id("stMain")
    expect(
        main.get_by_text("Stalled at the unigram entropy since step", exact=False).first
    ).to_be_visible()
    page.wait_for_timeout(4000)  # the page settles: a click during a redraw can land elsewhere
    findings = main.get_by_test_id("stExpander")
    findings.get_by_role("button", name="Show").first.click()  # the newest finding's
    expect(main.get_by_role("tab", name="Gradients", selected=True)).to_be_visible()
    page.wait_for_timeout(5000)  # the charts draw
    page.mouse.move(5, 5)  # no tooltip over the shot
    page.wait_for_timeout(1500)
    _settled(page)
    page.screenshot(path=out / "findings.png")


def main(argv: list[str] | None = None) -> int:
    """Serve the app on a fresh store and take the three screenshots."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument(
        "--all-tabs", action="store_true", help="also shoot every Live tab (live-<tab>.png)"
    )
    parser.add_argument("--size", default="1440x1000", help="browser window WIDTHxHEIGHT")
    parser.add_argument("--playground-only", action="store_true", help="take only playground.png")
    parser.add_argument(
        "--findings-only", action="store_true", help="train the starter runs; take findings.png"
    )
    parser.add_argument(
        "--studies-only",
        action="store_true",
        help=f"run the quick {STUDY} study from its page; take studies.png and study-chart.png",
    )
    args = parser.parse_args(argv)
    try:
        width, height = (int(part) for part in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size {args.size!r}: give WIDTHxHEIGHT, e.g. 1366x768")
    VIEWPORT.update(width=width, height=height)
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # a loaded machine takes seconds to draw a page

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["BLOCKVIZ_STORE"] = str(Path(tmp) / "runs" / "blockviz.db")
        env = dict(os.environ)
        port = _free_port()
        command = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)]
        server = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            _wait_healthy(port)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
                )
                page = browser.new_page(viewport=VIEWPORT)
                page.set_default_timeout(60_000)
                url = f"http://localhost:{port}"
                if args.findings_only:
                    _train_starters()
                    _findings(page, url, args.out)
                elif args.studies_only:
                    _studies(page, url, args.out)
                elif args.playground_only:
                    _playground(page, url, args.out)
                else:
                    _shoot(page, url, args.out, args.steps, args.all_tabs)
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
            # The runs outlive the app (as they should); they finished before Compare.
    shots = ("train.png", "live.png", "compare.png", "playground.png")
    if args.findings_only:
        shots = ("findings.png",)
    elif args.studies_only:
        shots = ("studies.png", "study-chart.png")
    elif args.playground_only:
        shots = ("playground.png",)
    print(f"wrote {', '.join(str(args.out / n) for n in shots)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
