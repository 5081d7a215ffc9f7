"""A study's zip and `study export` / `study show --json` on a constructed, finished study."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core.studies import define
from blockviz.core.studies.outcomes import results_frame
from blockviz.core.studies.verdicts import verdicts
from blockviz.store import RunStore
from blockviz.views.studies import report as study_report
from blockviz.views.studies import table as study_table
from blockviz.views.studies import text as study_text
from tests.helpers import fake_study

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "pages" / "studies.py"


def test_the_zip_holds_table_claims_charts_configs_and_a_safe_page() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        study_id = fake_study(store)
        store.update_study(study_id, name="<b>mine</b>")
        data = study_report.build_study_zip(store, study_id)
        plan = define.plan_from_spec(store.get_study(study_id).spec)
        judged = verdicts(plan, results_frame(store.study_runs(study_id), plan))
        name = study_report.zip_name(store.get_study(study_id))
    archive = zipfile.ZipFile(io.BytesIO(data))
    names = set(archive.namelist())
    assert {
        "results.csv",
        "results.md",
        "results.tex",
        "runs.csv",
        "claims.md",
        "index.html",
        "README.txt",
    } <= names
    assert len([n for n in names if n.startswith("configs/")]) == len(plan.variants)
    assert archive.read("charts/val-loss-by-variant.png")[:8] == b"\x89PNG\r\n\x1a\n"
    table = pd.read_csv(io.BytesIO(archive.read("results.csv")))
    assert table["Variant"].tolist() == [v.label for v in plan.variants]
    claims = archive.read("claims.md").decode()
    assert f"{judged[0].verdict.upper()}: {judged[0].claim.text}" in claims
    (intervals,) = study_table.interval_lines(judged[0])
    assert f"Intervals: {intervals}" in claims and "unpaired" in intervals
    page = archive.read("index.html").decode()
    assert "<b>mine</b>" not in page and "&lt;b&gt;mine&lt;/b&gt;" in page
    assert intervals in page
    assert name.endswith(".zip") and "/" not in name and "<" not in name


def test_the_zip_entries_unpack_as_files_everyone_may_read() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        data = study_report.build_study_zip(store, fake_study(store))
    archive = zipfile.ZipFile(io.BytesIO(data))
    modes = {info.filename: oct(info.external_attr >> 16) for info in archive.infolist()}
    assert set(modes.values()) == {oct(stat.S_IFREG | 0o644)}, modes  # -rw-r--r--, not 0600


@pytest.mark.slow
def test_show_json_and_export_from_the_command_line(tmp_path: Path) -> None:
    store_path = os.environ["BLOCKVIZ_STORE"]
    with RunStore(store_path) as store:
        study_id = fake_study(store)
        expected = study_text.summary_json(store, study_id)
    command = [sys.executable, "-m", "blockviz", "study"]
    shown = subprocess.run(
        [*command, "show", str(study_id), "--json", "--store", store_path],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert shown.returncode == 0, shown.stderr
    printed = json.loads(shown.stdout)
    assert printed["claims"] == expected["claims"]
    assert printed["claims"][0]["intervals"][0].startswith("GELU minus ReLU: paired ")
    assert printed["claims"][0]["numbers"]["pairs"] == 2
    assert "blew_up" in printed["variants"][0]
    assert [v["variant"] for v in printed["variants"]] == ["ReLU", "GELU", "SiLU (Swish)", "SwiGLU"]
    out = tmp_path / "out"
    exported = subprocess.run(
        [*command, "export", str(study_id), "--out", str(out), "--store", store_path],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert exported.returncode == 0, exported.stderr
    (written,) = out.glob("*.zip")
    assert "claims.md" in zipfile.ZipFile(written).namelist()


def test_show_prints_each_claim_with_both_intervals() -> None:
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        study_id = fake_study(store)
        text = study_text.summary_text(store, study_id)
    lines = text.splitlines()
    verdict_line = next(i for i, line in enumerate(lines) if "GELU does at least as well" in line)
    assert "the margin of +0.020 nats" in lines[verdict_line + 1]
    assert lines[verdict_line + 2].startswith("    intervals: GELU minus ReLU: paired ")
    assert "0 of 2 failed to train" in text


def test_the_page_and_the_zip_draw_each_variant_in_the_same_colour() -> None:
    """The page's chart pins each variant's colour in its spec (Streamlit's theme recoloured
    an unpinned one), and the zip's chart draws those colours."""
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        study_id = fake_study(store)
        for run_id in store.study_runs(study_id)["id"]:
            store.log_scalars(int(run_id), [(0, "val/loss", 4.2), (300, "val/loss", 2.0)])
        store.flush()
        plan = define.plan_from_spec(store.get_study(study_id).spec)
        archive = zipfile.ZipFile(io.BytesIO(study_report.build_study_zip(store, study_id)))
    at = AppTest.from_file(str(PAGE), default_timeout=60).run()
    assert not at.exception
    (curves,) = [
        json.loads(e.proto.spec) for e in at.get("vega_lite_chart") if "by variant" in e.proto.spec
    ]
    (scale,) = {
        json.dumps(layer["encoding"]["color"].get("scale")): layer["encoding"]["color"].get("scale")
        for layer in curves["layer"]
    }.values()
    assert scale is not None, "the page's colours are left to the theme"
    assert scale["domain"] == [v.label for v in plan.variants]
    svg = archive.read("charts/val-loss-by-variant.svg").decode()
    for colour in scale["range"]:
        assert f'"{colour}"' in svg
