"""The report zip holds each run's attention maps (PNG and SVG) and its generated samples."""

from __future__ import annotations

import io
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator

import pytest

from blockviz.store import RunStore
from blockviz.views.export.outfolder import safe_filename
from blockviz.views.export.report import build_report
from blockviz.views.export.report_extras import ATTENTION_LAYERS
from tests.real_runs import RealRuns, copy_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOSTILE = "<script>alert('x')</script> & <b>bold</b>"


@pytest.fixture(scope="module")
def report(
    tmp_path_factory: pytest.TempPathFactory, real_runs: RealRuns
) -> Iterator[tuple[RunStore, zipfile.ZipFile]]:
    """A real Pre-LN run and an attention-free one, the first with a hostile sample added."""
    store = RunStore(tmp_path_factory.mktemp("report-extras") / "blockviz.db")
    pre = copy_run(store, real_runs.path, real_runs.ids["pre"])
    ffn_only = copy_run(store, real_runs.path, real_runs.ids["ffn_only"])
    last = int(store.samples(pre, limit=1)["step"].iloc[0])
    store.log_sample(pre, last + 1, "\n", HOSTILE)
    store.flush()
    data = build_report(store, [pre, ffn_only])
    yield store, zipfile.ZipFile(io.BytesIO(data))
    store.close()


def test_the_report_draws_every_layer_of_the_latest_attention_step(
    report: tuple[RunStore, zipfile.ZipFile],
) -> None:
    store, archive = report
    names = archive.namelist()
    pre = store.get_run(1)
    step = store.attention_steps(1)[-1]
    n_layer = pre.config["model"]["n_layer"]
    expected = min(n_layer, ATTENTION_LAYERS)
    maps = [n for n in names if n.startswith("charts/attention-weights")]
    pngs = sorted(n for n in maps if n.endswith(".png"))
    svgs = sorted(n for n in maps if n.endswith(".svg"))
    assert len(pngs) == len(svgs) == expected, maps
    for layer in range(expected):
        (png,) = [n for n in pngs if f"layer-{layer}-step-{step}" in n]
        assert archive.read(png).startswith(PNG_SIGNATURE)
        svg = archive.read(png.removesuffix(".png") + ".svg").decode()
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")
        assert f"layer {layer}, step {step}" in " ".join(root.itertext())
    # The attention-free run has no maps, and says nothing wrong about it.
    assert not any(safe_filename(store.get_run(2).name, "") in n for n in maps)
    html = archive.read("report.html").decode()
    assert f"Attention weights \\u2014 layer 0, step {step}" in html  # in the specs (JSON)


def test_the_report_holds_every_sample_as_text_and_escapes_it_in_html(
    report: tuple[RunStore, zipfile.ZipFile],
) -> None:
    store, archive = report
    pre = store.get_run(1)
    samples = store.samples(1)
    text_file = f"samples/{safe_filename(pre.name, 'txt')}"
    assert text_file in archive.namelist()
    text = archive.read(text_file).decode("utf-8")
    for row in samples.itertuples():
        assert row.text in text
        assert f"step {int(row.step)}" in text
    html = archive.read("report.html").decode("utf-8")
    assert "<script>alert(" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold" in html
    readme = archive.read("README.txt").decode()
    assert text_file in readme and "samples" in readme
