"""AppTest of issue 13's chart items on Live and Compare: the x-axis control, one download
menu per chart (none for empty charts), and Compare's final-metrics name column."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core.spec import TRAIN_ELAPSED_S
from blockviz.dashboard import tables
from blockviz.dashboard.ui import DOWNLOAD_MENU
from blockviz.store import RunStore
from blockviz.views import charts
from tests import fakes
from tests.helpers import chart_specs, shown
from tests.real_runs import RealRuns, copy_run

PAGES = Path(__file__).resolve().parents[2] / "pages"
FORMATS = sorted(["PNG", "SVG", "HTML", "CSV"])


@pytest.fixture
def store() -> Iterator[RunStore]:
    opened = RunStore(os.environ["BLOCKVIZ_STORE"])
    yield opened
    opened.close()


def _page(name: str, **state: Any) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=60)
    for key, value in state.items():
        at.session_state[key] = value
    return at


def _x_fields(spec: dict) -> set[tuple[str, str]]:
    """(field, title) of every x encoding in a spec."""
    found = set()
    stack: list[Any] = [spec]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            x = node.get("x")
            if isinstance(x, dict) and "field" in x:
                found.add((x["field"], x.get("title", "")))
            stack += list(node.values())
        elif isinstance(node, list):
            stack += node
    return found


def _menus(at: AppTest) -> list[list[str]]:
    """The download buttons' labels inside each Download popover."""
    menus = []
    stack = list(at.main.children.values())
    while stack:
        node = stack.pop()
        proto = getattr(node, "proto", None)
        is_block = getattr(getattr(proto, "DESCRIPTOR", None), "name", "") == "Block"
        if is_block and proto.WhichOneof("type") == "popover":
            assert proto.popover.label == DOWNLOAD_MENU
            menus.append(sorted(b.label for b in node.get("download_button")))
        stack += list(getattr(node, "children", {}).values())
    return menus


# ---------------------------------------------------------------------------- x axis


def _run_without_clock(store: RunStore) -> int:
    """A fake run as recorded before training logged train/elapsed_s."""
    (run_id,) = fakes.populate(store, n_runs=1, n_steps=40, n_layer=2, probe_every=10)
    store.flush()
    with store.conn:
        store.conn.execute(
            "DELETE FROM scalars WHERE run_id = ? AND name = ?", (run_id, TRAIN_ELAPSED_S)
        )
    assert TRAIN_ELAPSED_S not in set(store.scalars(run_id)["name"])
    return run_id


@pytest.mark.parametrize(("kind", "tab"), [("tokens", "Loss"), ("time", "Gradients")])
def test_live_x_axis_control_switches_every_time_series_chart(
    store: RunStore, real_runs: RealRuns, kind: str, tab: str
) -> None:
    run_id = copy_run(store, real_runs.path, real_runs.ids["pre"])
    at = _page("live", run_id=run_id, **{"live.tab": tab}).run()
    assert not at.exception
    assert at.segmented_control(key="live.x_axis").value == "step"
    at.segmented_control(key="live.x_axis").set_value(kind).run()
    assert not at.exception and not at.error
    axis = charts.X_AXES[kind]
    series = {t: s for t, s in chart_specs(at).items() if "layer" not in t.lower()}
    assert series
    for title, spec in chart_specs(at).items():
        assert _x_fields(spec) == {(axis.field, axis.title)}, title
    assert not [c for c in at.caption if "not recorded" in c.value]


def test_live_falls_back_to_steps_with_a_note_when_time_was_not_recorded(
    store: RunStore,
) -> None:
    run_id = _run_without_clock(store)
    at = _page("live", run_id=run_id, **{"live.x_axis": "time"}).run()
    assert not at.exception
    assert any(charts.NO_TIME_NOTE in shown(c.value).lower() for c in at.caption)
    loss = chart_specs(at)["Loss"]
    assert {field for field, _ in _x_fields(loss)} == {"step"}


def test_compare_x_axis_and_note_name_the_run_without_a_clock(
    store: RunStore, real_runs: RealRuns
) -> None:
    timed = copy_run(store, real_runs.path, real_runs.ids["pre"])
    untimed = _run_without_clock(store)
    at = _page("compare", compare_ids=[timed], **{"compare.x_axis": "tokens"}).run()
    assert not at.exception
    assert _x_fields(chart_specs(at)["Loss"]) == {("tokens", charts.X_AXES["tokens"].title)}
    at = _page("compare", compare_ids=[timed, untimed], **{"compare.x_axis": "time"}).run()
    assert not at.exception
    untimed_name = store.get_run(untimed).name
    notes = [c.value for c in at.caption if "not recorded" in c.value]
    assert len(notes) == 1 and untimed_name in shown(notes[0])
    assert {field for field, _ in _x_fields(chart_specs(at)["Loss"])} == {"step"}


# ---------------------------------------------------------------------------- downloads


def test_one_download_menu_per_chart_and_none_for_empty_charts(
    store: RunStore, real_runs: RealRuns
) -> None:
    run_id = copy_run(store, real_runs.path, real_runs.ids["pre"])
    at = _page("live", run_id=run_id).run()
    assert not at.exception
    drawn = [s for s in chart_specs(at).values() if charts.NO_DATA not in json.dumps(s)]
    assert _menus(at) == [FORMATS] * len(drawn)
    chart_downloads = [b.label for b in at.download_button if b.label in FORMATS]
    assert sorted(chart_downloads) == sorted(FORMATS * len(drawn))
    # A queued run has nothing to draw yet: its charts say so and offer no download.
    (queued,) = fakes.populate(store, n_runs=1, n_steps=40, n_layer=2, statuses=["queued"])
    store.truncate_after(queued, -1)
    at = _page("live", run_id=queued).run()
    assert not at.exception
    assert chart_specs(at), "the placeholders are still drawn"
    assert _menus(at) == []
    assert not [b for b in at.download_button if b.label in FORMATS]  # the code export stays


# ---------------------------------------------------------------------------- Compare table


STREAMLIT_WIDTHS = {"small": 75, "medium": 200, "large": 400}


def _final_metrics(at: AppTest) -> tuple[list[str], dict[str, dict]]:
    """Compare's final-metrics table: its columns in order and their config."""
    (table,) = [d for d in at.dataframe if "steps" in d.value.columns]
    return list(table.value.columns), json.loads(table.proto.columns)


def test_compare_final_metrics_pin_the_whole_run_name(store: RunStore) -> None:
    ids = fakes.populate(store, n_runs=2, n_steps=40, n_layer=2, probe_every=10)
    long_name = "post-ln-300steps-lr0.01-warmup_steps0"  # a default run name's length
    store.update_run(ids[0], name=long_name)
    at = _page("compare", compare_ids=ids).run()
    assert not at.exception
    _, columns = _final_metrics(at)
    assert columns["run"]["pinned"] is True
    assert columns["run"]["width"] >= 16 + tables.NAME_CHAR_PX * len(long_name)


def test_compare_final_metrics_fit_a_laptop_screen_without_scrolling(store: RunStore) -> None:
    """Issue 35, defect 12: at 1366x768 every metric sat behind a horizontal scroll (run
    and findings were 400 px each). Up to its last metric the table fits the page's width
    there (906 px, measured in chromium with the sidebar open), whatever the names."""
    ids = fakes.populate(store, n_runs=2, n_steps=40, n_layer=2, probe_every=10)
    store.update_run(ids[0], name="pre-ln-" + "x" * 120)  # longer than any column
    at = _page("compare", compare_ids=ids).run()
    assert not at.exception
    order, columns = _final_metrics(at)
    metrics = ["val_loss", "val_bpc", "val_ppl", "train_loss", "steps", "time_s"]
    metrics += ["tokens_per_sec", "n_params"]
    assert order[: len(metrics) + 1] == ["run", *metrics]  # the name, then the metrics
    widths = [columns.get(name, {}).get("width") for name in order[: len(metrics) + 1]]
    assert None not in widths, dict(zip(order, widths, strict=False))
    pixels = [STREAMLIT_WIDTHS.get(w, w) for w in widths]
    assert sum(pixels) <= tables.LAPTOP_CONTENT_PX, dict(zip(order, pixels, strict=False))
    # Short headers; each one's help says it in full.
    assert columns["train_loss"]["label"] == "train loss"
    assert "last 50 steps" in columns["train_loss"]["help"]
