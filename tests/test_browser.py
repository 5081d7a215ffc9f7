"""One real-browser smoke test: the app in Debian's chromium, driven by Playwright.

Start the app, pick the tiny preset in the sidebar, Launch, watch the run gain steps on
the Live page, stop it, open Compare and download its report zip in one click. Uses
/usr/bin/chromium (never a downloaded browser) and skips, saying how to get it, when that
is absent.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from blockviz.core.procs import is_alive
from blockviz.store import RunStore
from blockviz.views.charts.colours import DARK_BACKGROUND, LIGHT_BACKGROUND

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PROJECT = Path(__file__).resolve().parent.parent
STARTUP_S = 30.0
STEP_WAIT_MS = 45_000  # the run's first steps include importing torch on a busy CI core
REPORT_WAIT_MS = 60_000  # the report renders every chart of the run with vl-convert


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"streamlit exited with {server.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"streamlit did not answer within {STARTUP_S:.0f}s:\n{log.read_text()[-2000:]}")


def _stop_runs(store_path: str) -> None:
    """Terminate the training processes this test's app launched (they outlive the app)."""
    if not Path(store_path).exists():
        return
    with RunStore(store_path) as store:
        pids = [int(p) for p in store.runs_frame()["pid"].dropna() if int(p) != os.getpid()]
    for pid in pids:
        if is_alive(pid, None):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(is_alive(p, None) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids:
        if is_alive(pid, None):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def app_url(tmp_path: Path) -> Iterator[str]:
    """The app served on a free local port with this test's store; always shut down."""
    if not CHROMIUM.exists():
        pytest.skip("chromium not installed: apt-get install chromium")
    pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    port = _free_port()
    log = tmp_path / "streamlit.log"
    command = [sys.executable, "-m", "streamlit", "run", "app.py"]
    command += ["--server.port", str(port), "--server.headless", "true"]
    with open(log, "wb") as out:
        server = subprocess.Popen(
            command, cwd=PROJECT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_healthy(port, server, log)
        yield f"http://localhost:{port}"
    finally:
        _stop_runs(os.environ["BLOCKVIZ_STORE"])
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _header_step(page) -> int | None:
    """The step Live's header shows ('Step 12 of 5,000 · ...' -> 12), or None."""
    facts = page.get_by_test_id("stCaptionContainer").filter(has_text=re.compile(r"^Step "))
    match = re.match(r"Step ([\d,]+)", facts.first.inner_text().strip())
    return int(match.group(1).replace(",", "")) if match else None


def _box(locator) -> dict[str, float]:
    """An element's box in the viewport (top, bottom, left, right), in CSS pixels."""
    return locator.evaluate(
        "e => { const r = e.getBoundingClientRect();"
        " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; }"
    )


LAPTOP = {"width": 1366, "height": 768}  # the screen the layout is made to fit


def test_launch_watch_live_and_compare(app_url: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # Generous waits: CI shares two cores between the app, the run and the browser.
            page.set_default_timeout(30_000)
            expect.set_options(timeout=30_000)
            # Train: the tiny preset from the sidebar, then Launch.
            sidebar, main = _open_with_tiny(page, app_url)
            # Long enough to watch it grow for a while; the test stops it.
            sidebar.get_by_text("Training", exact=True).click()
            steps = sidebar.get_by_role("spinbutton", name="Steps (max_steps)")
            steps.fill("5000")
            steps.press("Enter")
            expect(steps).to_have_value("5000")
            main.locator(".st-key-launch button").click()
            expect(main.get_by_text("Launched run #1")).to_be_visible()

            # Live, on a laptop screen: the run gains steps and its series reach the page.
            page.set_viewport_size(LAPTOP)
            sidebar.get_by_test_id("stSidebarNav").get_by_text("Live", exact=True).click()
            expect(main.get_by_text("#1 ", exact=False).first).to_be_visible()
            header = main.get_by_test_id("stCaptionContainer").filter(has_text=re.compile("^Step "))
            expect(header).to_contain_text("tokens/s", timeout=STEP_WAIT_MS)
            first = _header_step(page)
            assert first is not None
            deadline = time.monotonic() + STEP_WAIT_MS / 1000
            while (_header_step(page) or 0) <= first and time.monotonic() < deadline:
                page.wait_for_timeout(500)  # the page refreshes itself; nothing to click
            assert (_header_step(page) or 0) > first, "the Live page stopped gaining steps"
            loss = main.get_by_test_id("stVegaLiteChart").first
            expect(loss).to_be_visible()
            # Live opens on its charts: the loss chart starts above the fold at 1366x768.
            assert _box(loss)["top"] < LAPTOP["height"] - 200, _box(loss)
            # A finding's Show scrolls its tab's charts to the top of the window.
            _wait_idle(page)
            main.get_by_role("button", name="Show").first.click()
            tabs = main.get_by_role("tablist").first
            deadline = time.monotonic() + STEP_WAIT_MS / 1000  # the click reruns the page
            settled = 0  # checks in a row with the tabs near the top
            while settled < 3 and time.monotonic() < deadline:
                settled = settled + 1 if 0 <= _box(tabs)["top"] <= 150 else 0
                page.wait_for_timeout(300)
            assert settled == 3, _box(tabs)
            assert main.evaluate("e => e.scrollTop") > 0
            with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
                assert store.get_run(1).max_steps == 5000
                assert len(store.scalars(1, names="train/loss")) > 0
            main.get_by_role("button", name="Stop", exact=True).click()
            expect(main.get_by_text("stopped", exact=True)).to_be_visible(timeout=STEP_WAIT_MS)

            # Compare: the run overlaid, and the report one click away.
            sidebar.get_by_test_id("stSidebarNav").get_by_text("Compare", exact=True).click()
            expect(main.get_by_role("button", name="Download report (zip)")).to_be_visible()
            expect(main.get_by_test_id("stVegaLiteChart").first).to_be_visible()
            expect(main.get_by_text("Final metrics", exact=True)).to_be_visible()
            assert page.get_by_test_id("stException").count() == 0
            # A click that lands while the page reruns (the stopped run's status reaching
            # Compare) can be lost with the old button: click once the script is idle.
            _wait_idle(page)
            report = _download_report(page, main)
            assert report.read_bytes()[:4] == b"PK\x03\x04"
            with zipfile.ZipFile(report) as archive:
                assert "report.html" in archive.namelist()
        finally:
            browser.close()


def _download_report(page, main) -> Path:
    """Click "Download report (zip)" and return the saved file.

    The click builds the zip and the browser saves it. Should that download not start
    (Streamlit drops a generated file that nothing on the page refers to; the page now
    keeps it referred to, see dashboard/compare/report.py `_report_progress`), the page also offers
    the built zip as "Save the report again", which a user would click: so does this test,
    once, and on a miss there too it fails with what the page showed.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    shown: list[str] = []
    for label in ("Download report (zip)", "Save the report again"):
        try:
            with page.expect_download(timeout=REPORT_WAIT_MS) as download:
                main.get_by_role("button", name=label).click()
            print(f"report saved through {label!r}")  # which path worked, in the log
            return Path(download.value.path())
        except PlaywrightTimeout:
            shown.append(_page_messages(page))
            _wait_idle(page)
    pytest.fail("no report download from either button; the page showed:\n" + "\n--\n".join(shown))


def _page_messages(page) -> str:
    """The alerts, exceptions and download-button errors on the page, as text."""
    parts = []
    for test_id in ("stDownloadButtonError", "stAlert", "stException", "stProgress"):
        for i in range(page.get_by_test_id(test_id).count()):
            parts.append(f"{test_id}: {page.get_by_test_id(test_id).nth(i).inner_text()[:500]}")
    return "\n".join(parts) or "(no alert, error or progress bar)"


def _open_with_tiny(page, app_url: str):
    """Open the app and pick the tiny preset in the sidebar; (sidebar, main) locators."""
    from playwright.sync_api import expect

    page.goto(app_url)
    sidebar = page.get_by_test_id("stSidebar")
    _choose(page, sidebar, "Start from a preset", "tiny")
    expect(sidebar.get_by_text("2 layers, d_model 32")).to_be_visible()
    return sidebar, page.get_by_test_id("stMain")


def _choose(page, sidebar, label: str, option: str, tries: int = 4) -> None:
    """Pick `option` in the sidebar's selectbox `label`.

    A rerun that lands while the list is open (the Playground looks at the sidebar every
    second; a run that starts redraws the page) closes the list before the option can be
    clicked. A person opens it again; so does this, a few times.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        sidebar.get_by_role("combobox", name=label).click()
        try:
            page.get_by_role("option", name=option, exact=True).click(timeout=8_000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise
            page.keyboard.press("Escape")
            page.wait_for_timeout(500)


def _wait_idle(page, quiet_ms: int = 1500, timeout_s: float = 30.0) -> None:
    """Wait until Streamlit's "running" indicator has stayed away for quiet_ms."""
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        if page.get_by_test_id("stStatusWidget").count() == 0:
            quiet_since = quiet_since or time.monotonic()
            if (time.monotonic() - quiet_since) * 1000 >= quiet_ms:
                return
        else:
            quiet_since = None
        page.wait_for_timeout(200)


def _status(run_id: int) -> str:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        return str(store.get_run(run_id).status)


def _loss_rows(run_id: int) -> int:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        if store.runs_frame().empty or run_id not in set(store.runs_frame()["id"]):
            return 0
        return len(store.scalars(run_id, names="train/loss"))


def test_auto_run_draws_pre_ln_then_post_ln_without_launch(app_url: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.set_default_timeout(30_000)
            expect.set_options(timeout=STEP_WAIT_MS)
            sidebar, main = _open_with_tiny(page, app_url)
            sidebar.get_by_test_id("stSidebarNav").get_by_text("Playground", exact=True).click()
            # Its quick fields beside the trail chart, all on a laptop screen at once.
            norm = main.get_by_role("combobox", name="Norm position")
            expect(norm).to_be_visible()
            assert sidebar.get_by_role("combobox", name="Norm position").count() == 0

            # Auto-run on: the sidebar's Pre-LN config trains and its loss is drawn.
            main.get_by_text("Auto-run", exact=True).click()
            trail = main.locator("p")  # one line per auto-run, under the chart
            expect(trail.filter(has_text="#1 start: tiny (newest) ·")).to_be_visible()
            deadline = time.monotonic() + STEP_WAIT_MS / 1000
            while _loss_rows(1) == 0 and time.monotonic() < deadline:
                page.wait_for_timeout(500)
            assert _loss_rows(1) > 0, "the first auto-run logged no loss"
            chart = main.get_by_test_id("stVegaLiteChart").filter(has_text="Auto-runs: loss")
            expect(chart).to_be_visible()

            quick, drawn = _box(norm), _box(chart)
            assert quick["right"] <= drawn["left"], (quick, drawn)  # side by side
            for box in (quick, drawn, _box(main.get_by_text("Learning rate", exact=True))):
                assert box["top"] >= 0 and box["bottom"] <= LAPTOP["height"], box

            # Flip to Post-LN beside the chart: a second run joins the chart; no Launch.
            _choose(page, main, "Norm position", "post")
            second = trail.filter(has_text="#2 norm_position: pre → post (newest) ·")
            expect(second).to_be_visible()
            # The replaced run stays in the trail, no longer the newest.
            expect(trail.filter(has_text="#1 start: tiny ·")).to_be_visible()
            deadline = time.monotonic() + STEP_WAIT_MS / 1000
            while _loss_rows(2) == 0 and time.monotonic() < deadline:
                page.wait_for_timeout(500)
            assert _loss_rows(2) > 0, "the second auto-run logged no loss"
            # Both curves in the chart: its legend names the two runs.
            expect(chart.get_by_text("#2 norm_position=post", exact=True)).to_be_visible()
            expect(chart.get_by_text("#1 start: tiny", exact=True)).to_be_visible()
            assert main.get_by_text("Launched run #").count() == 0
            assert page.get_by_test_id("stException").count() == 0

            # One download from a chart's menu: the trail's data as CSV, both runs in it.
            # The legend names every run of the trail before its rows arrive, so wait for
            # the second run to end: the chart (and its CSV) then holds all of its rows.
            deadline = time.monotonic() + STEP_WAIT_MS / 1000
            while _status(2) in ("queued", "running") and time.monotonic() < deadline:
                page.wait_for_timeout(500)
            _wait_idle(page, quiet_ms=3000)
            main.locator(".st-key-playground-menu button").first.click()
            with page.expect_download(timeout=REPORT_WAIT_MS) as download:
                page.get_by_role("button", name="CSV").click()
            csv_text = Path(download.value.path()).read_text(encoding="utf-8")
            header = csv_text.splitlines()[0]
            assert "step" in header.split(","), header
            assert "#1 start: tiny" in csv_text and "#2 norm_position" in csv_text
            with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
                runs = store.runs_frame()
            assert list(runs["id"]) == [1, 2]
            assert all("auto" in tags.split(", ") for tags in runs["tags"])
        finally:
            browser.close()


LONG_NAME = "pre-ln-300steps-lr0.003-warmup_steps30-d_model128-n_layer4-rmsnorm-gelu"
# The backgrounds the charts' colours are chosen against (views/charts/colours.py).
PAGE_BACKGROUNDS = {
    scheme: "rgb({}, {}, {})".format(*(int(colour[i : i + 2], 16) for i in (1, 3, 5)))
    for scheme, colour in (("light", LIGHT_BACKGROUND), ("dark", DARK_BACKGROUND))
}


def test_compare_follows_the_systems_light_or_dark_setting(app_url: str) -> None:
    """Issue 35, defects 12 and 13: the app forced a light theme, and a long run name was
    cut in the legend. Each scheme the browser prefers is the page's; the loss chart's
    legend draws the long name whole in both."""
    from playwright.sync_api import expect, sync_playwright

    from tests import fakes

    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        config = fakes.fake_config(n_layer=2, d_model=32, n_head=2, max_steps=60, warmup_steps=6)
        fakes.add_run(store, config, name=LONG_NAME)
        fakes.add_run(store, config, name="short", index=1)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for scheme, background in PAGE_BACKGROUNDS.items():
                page = browser.new_page(viewport=LAPTOP, color_scheme=scheme)
                page.set_default_timeout(30_000)
                expect.set_options(timeout=30_000)
                page.goto(f"{app_url}/compare")
                main = page.get_by_test_id("stMain")
                expect(main.get_by_text("Final metrics", exact=True)).to_be_visible()
                shown = page.evaluate(
                    "getComputedStyle(document.querySelector('.stApp')).backgroundColor"
                )
                assert shown == background, (scheme, shown)
                loss = main.get_by_test_id("stVegaLiteChart").first
                # The wrapped label is one <text> of several lines: its text is the name.
                expect(loss.get_by_text(LONG_NAME, exact=True)).to_be_visible()
                assert page.get_by_test_id("stException").count() == 0
                page.close()
        finally:
            browser.close()
