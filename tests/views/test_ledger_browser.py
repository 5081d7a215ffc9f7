"""The ledger's HTML in Debian's headless chromium with the network off: every card is
there and every chart is drawn, from what the file holds alone.

The network is off by a proxy on a closed port (127.0.0.1:9, loopback included), so a
fetch of anything fails; the DOM after the page's scripts ran must hold each card and
an SVG inside each chart's element. Skips, saying how to get it, without /usr/bin/chromium.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from blockviz.store import RunStore
from blockviz.views.ledger import build, page
from tests.helpers import fake_study

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = Path("/usr/bin/chromium")
OFFLINE = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def test_the_exported_page_draws_every_card_and_chart_offline(tmp_path: Path) -> None:
    if not CHROMIUM.is_file():
        pytest.skip("chromium not installed: apt-get install chromium")
    with RunStore(tmp_path / "ledger.db") as store:
        fake_study(store, "lr-sensitivity")
        fake_study(store, "sublayers")
        ledger = build.ledger(store)
    target = tmp_path / "ledger.html"
    target.write_text(page.ledger_html(ledger), encoding="utf-8")
    done = subprocess.run(
        [str(CHROMIUM), *OFFLINE, "--virtual-time-budget=20000", "--dump-dom", target.as_uri()],
        capture_output=True,
        text=True,
        timeout=240,
    )
    dom = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert dom.count('class="card"') == len(ledger.entries)
    drawn = r'<div class="chart[^"]*" id="(chart-\d+)"[^>]*>(.*?)</div>\s*</section>'
    charts = re.findall(drawn, dom, re.S)
    assert [chart_id for chart_id, _ in charts] == ["chart-0", "chart-1"]  # two lr claims
    for chart_id, body in charts:
        assert "<svg" in body and "final val loss against lr" in body, chart_id
