"""Findings where the user looks: Live's panel (Show, Try, the marked step), Compare's column,
the report, `blockviz show`, on copies of the real findings runs (tests/finding_runs.py)."""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from blockviz import cli
from blockviz.store import RunStore
from blockviz.views import charts
from blockviz.views.export.report import build_report
from tests.helpers import shown
from tests.real_runs import copy_run

PAGES = Path(__file__).resolve().parents[2] / "pages"


@pytest.fixture
def copies(finding_runs) -> dict[str, int]:
    """The starter-post, starter-none and healthy runs copied into this test's store."""
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        return {
            label: copy_run(store, finding_runs.path, finding_runs.ids[label])
            for label in ("starter-post", "starter-none", "healthy")
        }


def live(run_id: int) -> AppTest:
    at = AppTest.from_file(str(PAGES / "live.py"), default_timeout=60)
    at.session_state["run_id"] = run_id
    return at.run()


def marked(at: AppTest) -> list[str]:
    """The labels of the finding marks on the page's charts (one per marked chart)."""
    labels = []
    for element in at.get("vega_lite_chart"):
        if charts.MARK_COLOR not in element.proto.spec:
            continue
        for dataset in element.proto.datasets:
            frame = pa.ipc.open_stream(dataset.data.data).read_all().to_pandas()
            if "label" in frame.columns and len(frame) == 1:
                labels.append(str(frame["label"].iloc[0]))
    return labels


def test_live_says_a_stalled_run_stalled_at_the_top_with_its_findings(copies):
    at = live(copies["starter-post"])
    assert not at.exception
    (headline,) = [shown(w.value) for w in at.warning if "Stalled" in w.value]
    assert "Stalled at the unigram entropy since step" in headline
    assert "3.25 for predicting each character by its frequency alone" in headline
    (expander,) = at.main.expander
    # beside the three warnings, the induction timeline's (info) "No induction heads yet"
    assert expander.label.startswith("Findings (4, newest first)")
    captions = " ".join(shown(c.value) for c in at.caption)
    assert "first block's gradient norm" in captions and "Xiong et al. 2020" in captions


def test_show_opens_the_tab_that_draws_the_finding_and_marks_its_step(copies):
    at = live(copies["starter-post"])
    buttons = [b for b in at.button if b.label == "Show"]
    # the headline's Show, then one per finding, newest first: gradients vanish is first
    buttons[1].click().run()
    assert not at.exception
    assert at.session_state["live.tab"] == "Gradients"
    mark = at.session_state["live.mark"]
    assert mark["run"] == copies["starter-post"] and mark["step"] == 50
    assert len(marked(at)) >= 3  # the per-layer lines, the heat map and the global norm
    assert "Gradients vanish towards the input (step 50)" in marked(at)
    at.button(key="live.finding.clear").click().run()
    assert "live.mark" not in at.session_state and not marked(at)


def test_try_loads_the_runs_config_with_the_fix_and_opens_train(copies):
    at = live(copies["starter-post"])
    # the stall, the vanishing gradients and the slow updates each suggest Pre-LN
    button, *_ = [b for b in at.button if b.label == "Try norm_position = pre"]
    button.click().run()
    assert not at.exception
    assert at.session_state["cfg.norm_position"] == "pre"
    assert at.session_state["cfg.warmup_steps"] == 0


def test_live_tells_a_diverged_run_once_at_the_top(copies):
    at = live(copies["starter-none"])
    assert not at.exception
    (headline,) = [shown(e.value) for e in at.error]
    assert "Diverged at step 2." in headline
    # The loss itself is the run's (a blow-up's value moves with float rounding, so the
    # sentence is checked against the stored row, not a number written here).
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        losses = store.scalars(copies["starter-none"], names="train/loss")
    last = float(losses.loc[losses["step"] == 1, "value"].iloc[0])
    said = re.search(r"The last finite training loss was (\S+) at step 1\.", headline)
    assert said and float(said.group(1)) == pytest.approx(last, rel=1e-3)
    assert "too few to tell which layer's gradient grew first" in headline


def test_live_says_a_healthy_run_trains_and_that_no_check_fired(copies):
    at = live(copies["healthy"])
    assert not at.exception
    (headline,) = [shown(s.value) for s in at.success]
    assert headline.startswith("**Trains.**")
    assert any("None of the 16 checks found a problem" in shown(c.value) for c in at.caption)


def test_compare_has_a_findings_column(copies):
    at = AppTest.from_file(str(PAGES / "compare.py"), default_timeout=60)
    at.session_state["compare_ids"] = [copies["starter-post"], copies["healthy"]]
    at.run()
    assert not at.exception
    (final,) = [d.value for d in at.dataframe if "findings" in d.value.columns]
    by_run = dict(zip(final["run"], final["findings"], strict=True))
    assert by_run["healthy"] == "Trains"
    assert by_run["starter-post"].startswith("Stalled at the unigram entropy since step ")
    assert "Gradients vanish towards the input" in by_run["starter-post"]


def test_the_report_and_show_carry_the_findings(copies, capsys):
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        data = build_report(store, [copies["starter-post"], copies["healthy"]])
    archive = zipfile.ZipFile(io.BytesIO(data))
    table = pd.read_csv(io.BytesIO(archive.read("findings.csv")))
    rules = set(zip(table["run"], table["rule"], strict=True))
    assert {("healthy", "state"), ("healthy", "healthy"), ("starter-post", "stalled")} <= rules
    assert "| starter-post |" in archive.read("findings.md").decode()
    page = archive.read("report.html").decode()
    assert "<h2>Findings</h2>" in page and "Gradients vanish towards the input" in page
    # Suggestions come from a paper or are a rule of thumb (the starter's warm-up and a
    # lower lr): the page never calls them the literature's.
    assert "literature" not in page and 'a paper or "a rule of thumb"' in page
    assert cli.main(["show", str(copies["starter-post"])]) == 0
    out = capsys.readouterr().out
    assert "\nfindings:\n" in out
    assert "[warning] Stalled at the unigram entropy since step " in out
    assert cli.main(["show", str(copies["starter-none"]), "--json"]) == 0
    shown_json = json.loads(capsys.readouterr().out)
    assert shown_json["headline"]["title"] == "Diverged at step 2"
    assert shown_json["headline"]["tab"] == "Loss"


def panel_page() -> None:
    """Live's findings panel alone, on a constructed run probed at steps 0 and 299 only."""
    from blockviz.core import findings as fd
    from blockviz.core.findings.training import headline
    from blockviz.dashboard.findings_panel import findings_panel
    from blockviz.store import RunRecord
    from blockviz.views.run_findings import RunFindings
    from tests.helpers import probed_at

    run = probed_at((0, 299))
    found = fd.evaluate(run)
    row = RunRecord(id=1, name="sparse", config=run.config.to_dict())
    findings_panel(row, RunFindings(headline(run, found), found), lambda finding: None)


def test_the_panel_opens_its_findings_when_checks_could_not_be_made():
    at = AppTest.from_function(panel_page, default_timeout=60).run()
    assert not at.exception
    (expander,) = at.main.expander
    assert expander.proto.expanded  # not left folded under a green "Trains"
    (caption,) = [shown(c.value) for c in at.caption]
    assert "Could not check gradients across depth" in caption
    assert "only 1 probe after step 0, and a state needs 2 probes in a row after it" in caption
    assert any(b.label == "Try probe_interval = 30" for b in at.button)
