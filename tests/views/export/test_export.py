"""Export: PNG / SVG / HTML / CSV of a chart, tables, safe writes, the report zip, the CLI."""

from __future__ import annotations

import io
import json
import re
import stat
import struct
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from blockviz import cli
from blockviz.core import config as cfg
from blockviz.store import RunStore
from blockviz.views import charts
from blockviz.views.export.ablation import final_metrics_table, latex_escape
from blockviz.views.export.outfolder import MAX_STEM, ExportError, safe_filename, write_file
from blockviz.views.export.render import chart_csv, chart_html, chart_png, chart_svg, svg_png
from blockviz.views.export.report import build_report, config_diff_table, report_charts
from tests.real_runs import RealRuns, as_running, copy_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NETWORK_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=", re.IGNORECASE)
NETWORK_LINK = re.compile(r"<link[^>]*\bhref\s*=\s*[\"']?https?:", re.IGNORECASE)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, real_runs: RealRuns) -> Iterator[RunStore]:
    """Real tiny runs: a finished Pre-LN run 1 and a Post-LN run 2 still running at step 15."""
    run_store = RunStore(tmp_path_factory.mktemp("export") / "blockviz.db")
    for label in ("pre", "post"):
        copy_run(run_store, real_runs.path, real_runs.ids[label])
    as_running(run_store, 2, step=15)
    yield run_store
    run_store.close()


@pytest.fixture(scope="module")
def report(store: RunStore) -> tuple[zipfile.ZipFile, list[tuple[float, str]]]:
    """The report zip of both runs, and the progress calls made while building it."""
    calls: list[tuple[float, str]] = []
    data = build_report(store, [1, 2], progress=lambda f, m: calls.append((f, m)))
    return zipfile.ZipFile(io.BytesIO(data)), calls


@pytest.fixture(scope="module")
def loss_chart(store: RunStore):
    return charts.loss_chart(store.scalars([1, 2]), title="Loss")


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which always follows the signature."""
    assert png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def svg_text(svg: str) -> str:
    return " ".join(ET.fromstring(svg).itertext())


def test_png_has_the_signature_and_twice_the_svg_size(loss_chart) -> None:
    png = chart_png(loss_chart, scale=2.0)
    svg = chart_svg(loss_chart)
    root = ET.fromstring(svg)
    width, height = float(root.get("width")), float(root.get("height"))
    assert png.startswith(PNG_SIGNATURE)
    png_width, png_height = png_size(png)
    assert abs(png_width - 2 * width) <= 1
    assert abs(png_height - 2 * height) <= 1
    assert svg_png(svg) == png  # the report's shortcut gives the very same image


def test_svg_parses_and_shows_title_and_axis_titles(store: RunStore, loss_chart) -> None:
    text = svg_text(chart_svg(loss_chart))
    for label in ("Loss", "step", "loss (nats/char)", store.get_run(1).name):
        assert label in text


def test_chart_html_embeds_the_spec_and_needs_no_network(loss_chart) -> None:
    page = chart_html(loss_chart)
    assert "vega-lite" in page and '"title":"Loss"' in page.replace(" ", "")
    assert "vegaEmbed" in page
    assert not NETWORK_SCRIPT.search(page)
    assert not NETWORK_LINK.search(page)


def test_chart_csv_round_trips_store_values(tmp_path: Path) -> None:
    run_store = RunStore(tmp_path / "one.db")
    run_id = run_store.create_run("values", cfg.RunConfig().to_json(), status="completed")
    values = [1 / 3, 1e-12, 12345.678901234567, 2.0**-30, 7.0]
    run_store.log_scalars(run_id, [(step, "train/loss", v) for step, v in enumerate(values)])
    run_store.flush()
    chart = charts.metric_chart(run_store.scalars(run_id), "train/loss", smoothing=0.0)
    parsed = pd.read_csv(io.StringIO(chart_csv(chart)))
    assert parsed["step"].tolist() == list(range(len(values)))
    assert parsed["value"].tolist() == values  # exact: CSV keeps every bit of a float
    assert parsed["smoothed"].tolist() == values
    run_store.close()


def test_report_zip_lists_every_promised_file(store: RunStore, report) -> None:
    archive, _ = report
    names = set(archive.namelist())
    for title, _, _ in report_charts(store, [1, 2]):
        stem = safe_filename(title, "")
        for ext in ("png", "svg", "csv"):
            assert f"charts/{stem}.{ext}" in names, (title, ext)
    runs = store.runs_frame()
    for name in runs["name"]:
        assert f"configs/{safe_filename(name, 'json')}" in names
    promised = {
        "scalars.csv",
        "scalars_train.csv",
        "scalars_val.csv",
        "layer_stats.csv",
        "final_metrics.csv",
        "final_metrics.md",
        "final_metrics.tex",
        "report.html",
        "README.txt",
    }
    assert promised <= names
    readme = archive.read("README.txt").decode()
    assert all(name in readme for name in names)
    for name in names:
        if name.endswith(".png"):
            assert archive.read(name).startswith(PNG_SIGNATURE)
        if name.endswith(".svg"):
            ET.fromstring(archive.read(name))


def test_report_zip_entries_unpack_as_files_everyone_may_read(report) -> None:
    archive, _ = report
    modes = {info.filename: oct(info.external_attr >> 16) for info in archive.infolist()}
    assert set(modes.values()) == {oct(stat.S_IFREG | 0o644)}, modes  # -rw-r--r--, not 0600


def test_report_configs_are_the_runs_configs(store: RunStore, report) -> None:
    archive, _ = report
    for run_id in (1, 2):
        run = store.get_run(run_id)
        text = archive.read(f"configs/{safe_filename(run.name, 'json')}").decode()
        assert cfg.RunConfig.from_json(text) == cfg.RunConfig.from_dict(run.config)


def test_report_scalars_csv_holds_every_scalar(store: RunStore, report) -> None:
    archive, _ = report
    exported = pd.read_csv(io.BytesIO(archive.read("scalars.csv")))
    stored = store.scalars([1, 2])
    assert list(exported.columns) == ["run", "step", "name", "value"]
    assert len(exported) == len(stored)
    np.testing.assert_array_equal(exported["value"].to_numpy(), stored["value"].to_numpy())
    val = pd.read_csv(io.BytesIO(archive.read("scalars_val.csv")))
    assert set(val["name"]) == {n for n in stored["name"] if n.startswith("val/")}


def test_report_html_is_offline_with_one_bundle_and_says_what_was_running(report) -> None:
    archive, _ = report
    page = archive.read("report.html").decode()
    assert not NETWORK_SCRIPT.search(page)
    assert not NETWORK_LINK.search(page)
    assert page.count("window.vegaEmbed=") == 1  # the JS bundle is inlined once
    charts_in_zip = sum(1 for n in archive.namelist() if n.endswith(".svg"))
    specs = json.loads(re.search(r"const specs = (\[.*?\]);\n", page, re.S).group(1))
    assert len(specs) == charts_in_zip
    assert "was still running at step" in page
    assert "was still running at step" in archive.read("README.txt").decode()
    assert "norm_position" in page  # the config diff: run 1 is Pre-LN, run 2 Post-LN


def test_report_progress_rises_to_done(report) -> None:
    _, calls = report
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions)
    assert fractions[0] == 0.0 and fractions[-1] == 1.0


def test_config_diff_shows_only_differing_fields(store: RunStore) -> None:
    runs = [store.get_run(1), store.get_run(2)]
    headers, rows = config_diff_table(runs)
    assert headers == ["field", runs[0].name, runs[1].name]
    fields = {row[0] for row in rows}
    assert "norm_position" in fields
    assert "n_layer" not in fields and "d_model" not in fields
    assert all(row[1] != row[2] for row in rows)


METRICS = pd.DataFrame(
    {
        "run": ["pre_ln", "post 50% & #2"],
        "status": ["completed", "diverged"],
        "steps": pd.array([2000, 350], dtype="Int64"),
        "train_loss": [1.2345678, float("inf")],
        "answer_acc": [np.nan, np.nan],
        "n_params": pd.array([809984, 809984], dtype="Int64"),
    }
)


def test_latex_table_is_booktabs_with_escaped_text() -> None:
    _, _, latex = final_metrics_table(METRICS)
    lines = latex.strip().splitlines()
    spec = re.fullmatch(r"\\begin\{tabular\}\{([lr]+)\}", lines[0]).group(1)
    assert spec.startswith("l")
    assert lines[-1] == r"\end{tabular}"
    rules = [lines.index(r) for r in (r"\toprule", r"\midrule", r"\bottomrule")]
    assert rules == sorted(rules)
    assert r"pre\_ln" in latex and r"post 50\% \& \#2" in latex
    body = [line for line in lines if line.endswith(r"\\")]
    assert len(body) == 1 + len(METRICS)
    for line in body:  # the unescaped & separate exactly one cell per column
        assert len(re.findall(r"(?<!\\)&", line)) == len(spec) - 1
    assert "answer" not in latex  # a column empty for every run is left out


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("a_b", r"a\_b"),
        ("50% & #1", r"50\% \& \#1"),
        ("$x^2$", r"\$x\textasciicircum{}2\$"),
        ("{a}~b", r"\{a\}\textasciitilde{}b"),
        ("c:\\d", r"c:\textbackslash{}d"),
    ],
)
def test_latex_escape(text: str, escaped: str) -> None:
    assert latex_escape(text) == escaped


def test_markdown_and_csv_tables() -> None:
    csv_text, markdown, _ = final_metrics_table(METRICS)
    rows = markdown.strip().splitlines()
    assert len(rows) == 2 + len(METRICS)
    assert all(r.startswith("| ") and r.endswith(" |") for r in rows)
    assert "1.2346" in markdown and "809,984" in markdown
    parsed = pd.read_csv(io.StringIO(csv_text))
    assert list(parsed.columns) == list(METRICS.columns)  # CSV keeps every column
    assert parsed["train_loss"][0] == METRICS["train_loss"][0]


@pytest.mark.parametrize(
    "text",
    [
        "../x",
        "/etc/passwd",
        "a/b\\c",
        "..",
        "",
        "   ",
        "....",
        "a..b/../c",
        "run: 1/2 ‖Δθ‖",
        "x" * 500,
        ".hidden",
    ],
)
def test_safe_filename_is_one_plain_name(text: str) -> None:
    name = safe_filename(text, "png")
    assert re.fullmatch(r"[a-z0-9][a-z0-9._-]*\.png", name)
    assert ".." not in name and "/" not in name and "\\" not in name
    assert len(name) <= MAX_STEM + len(".png")


def test_safe_filename_keeps_readable_names() -> None:
    assert safe_filename("Loss — preln vs postln", "svg") == "loss-preln-vs-postln.svg"


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/b", "a\\b", "..", ".", ""])
def test_write_file_refuses_names_that_leave_the_folder(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(ExportError):
        write_file(out, name, b"data")
    assert not (tmp_path / "x").exists()
    assert not out.exists() or not any(out.iterdir())


def test_write_file_refuses_a_symlink_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (out / "report.txt").symlink_to(outside)
    with pytest.raises(ExportError, match="not a regular file"):
        write_file(out, "report.txt", "overwritten")
    assert outside.read_text() == "keep"


def test_write_file_overwrite_behaviour(tmp_path: Path) -> None:
    path = write_file(tmp_path, "a.csv", "one")
    assert path == (tmp_path / "a.csv").resolve()
    write_file(tmp_path, "a.csv", "two")
    assert path.read_text() == "two"
    with pytest.raises(ExportError, match="already exists"):
        write_file(tmp_path, "a.csv", "three", overwrite=False)
    assert path.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["a.csv"]  # no temp file left behind


@pytest.fixture
def finished_run(real_runs: RealRuns) -> Iterator[str]:
    """One completed real run in the default store ($BLOCKVIZ_STORE); its name."""
    run_store = RunStore()
    run_id = copy_run(run_store, real_runs.path, real_runs.ids["pre"])
    name = run_store.get_run(run_id).name
    run_store.close()
    yield name


def test_cli_export_all_writes_every_format(
    finished_run: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "exported"
    assert cli.main(["export", finished_run, "--out", str(out), "--format", "all"]) == 0
    printed = [Path(line) for line in capsys.readouterr().out.splitlines()[:-1]]
    assert printed and all(p.is_file() for p in printed)
    assert all(out.resolve() in p.resolve().parents for p in printed)
    for ext in ("png", "svg", "html", "csv"):
        assert list((out / "charts").glob(f"*.{ext}")), ext
    assert (out / "charts" / "loss.png").read_bytes().startswith(PNG_SIGNATURE)
    assert len(list(out.glob("*.zip"))) == 1
    for name in ("scalars.csv", "layer_stats.csv", "final_metrics.tex", "report.html"):
        assert (out / name).is_file(), name
    assert (out / "configs" / safe_filename(finished_run, "json")).is_file()


def test_cli_export_csv_renders_nothing(finished_run: str, tmp_path: Path) -> None:
    out = tmp_path / "csv"
    assert cli.main(["export", finished_run, "--out", str(out), "--format", "csv"]) == 0
    assert {p.suffix for p in out.rglob("*") if p.is_file()} == {".csv"}
    loss = pd.read_csv(out / "charts" / "loss.csv")
    assert {"run", "step", "name", "value", "smoothed"} <= set(loss.columns)


def test_cli_export_unknown_run_is_one_line_exit_2(
    finished_run: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["export", "no-such-run", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no-such-run" in err
    assert not (tmp_path / "o").exists()
