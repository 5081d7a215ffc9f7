"""User text (run names, datasets, errors, URLs) shows as plain text on every page, never as
Markdown: an image link in a name must not make the browser fetch anything."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core.naming import sanitize_name
from blockviz.dashboard import ui
from blockviz.dashboard.runs_panel import TABLE_KEY
from blockviz.store import RunStore, default_store_path
from tests import fakes
from tests.helpers import autolinks, selected_rows, shown
from tests.real_runs import RealRuns, copy_run

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 60
PIXEL = "![t](http://127.0.0.1:9/p.png)"
EVIL = f"**bold** __under__ :red[x] {PIXEL}"
# What must never reach Markdown unescaped: an image, a link target, a colour directive,
# emphasis markers. An escaped character has a backslash before it.
ACTIVE_MARKDOWN = {
    "image": re.compile(r"(?<!\\)!\["),
    "link target": re.compile(r"(?<!\\)\]\("),
    "directive": re.compile(r"(?<!\\):red\["),
    "strong": re.compile(r"(?<!\\)\*\*bold"),
    "underscores": re.compile(r"(?<!\\)__under"),
}
# Elements whose text Streamlit shows verbatim (no Markdown), and proto fields that hold
# data rather than text (selectbox options are plain text, a chart spec is Vega).
VERBATIM_ELEMENTS = {"code", "text", "dataframe", "json", "table", "vega_lite_chart"}
MARKDOWN_FIELDS = {"body", "label", "text", "help", "placeholder", "caption"}
STATUSES = ("completed", "running", "diverged", "failed")


def _strings(message: Any) -> Iterator[str]:
    """The Markdown-bearing string fields of a proto message, nested messages included."""
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            if field.name in MARKDOWN_FIELDS and isinstance(value, str):
                yield value
            continue
        for child in [value] if hasattr(value, "ListFields") else value:
            yield from _strings(child)


def markdown_texts(at: AppTest) -> list[str]:
    """Every string the page hands to Streamlit's Markdown renderer (main and sidebar)."""
    found: list[str] = []

    def visit(node: Any) -> None:
        proto = getattr(node, "proto", None)
        if getattr(node, "type", None) not in VERBATIM_ELEMENTS and proto is not None:
            found.extend(_strings(proto))
        for child in getattr(node, "children", {}).values():
            visit(child)

    visit(at._tree)
    return found


def assert_no_active_markdown(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    texts = markdown_texts(at)
    assert texts, "the page rendered nothing to check"
    for text in texts:
        for what, pattern in ACTIVE_MARKDOWN.items():
            assert not pattern.search(text), f"unescaped {what} in {text!r}"


@pytest.fixture
def store() -> Iterator[RunStore]:
    run_store = RunStore(default_store_path())
    yield run_store
    run_store.close()


@pytest.fixture
def evil(store: RunStore, real_runs: RealRuns) -> dict[str, int]:
    """A run per status (the completed one real, the others fake), each named EVIL (as
    sanitised), with EVIL as its dataset, and EVIL in the error of the failed and diverged
    runs: status -> id."""
    ids = [copy_run(store, real_runs.path, real_runs.ids["pre"])]
    ids += fakes.populate(store, n_runs=3, n_steps=40, n_layer=2, statuses=STATUSES[1:])
    by_status = {}
    for index, run_id in enumerate(ids):
        run = store.get_run(run_id)
        config = run.config
        config["data"]["dataset"] = PIXEL
        fields: dict[str, Any] = {"config": config, "dataset": {"name": PIXEL}}
        if run.status in ("failed", "diverged"):
            fields["error"] = f"RuntimeError: {EVIL}"
        store.update_run(run_id, **fields)
        store.rename_run(run_id, f"{EVIL} {index}")
        log = store.run_dir(run_id) / "train.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"step 1\n{EVIL}\n")
        by_status[run.status] = run_id
    store.flush()
    return by_status


def open_page(page: str, **session: Any) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in session.items():
        at.session_state[key] = value
    at.run()
    if page != "pages/train.py":
        at.switch_page(page).run()
    return at


def test_the_sanitised_name_still_carries_markdown() -> None:
    # Why names need escaping too: sanitize_name keeps `_`, so `__under__` survives.
    assert "__under__" in sanitize_name(EVIL)


@pytest.mark.parametrize(
    "text",
    [
        "notes from http://example.com.txt",
        "HTTPS://EXAMPLE.COM/a?b=c",
        "(see www.example.org)",
        "mail me@example.com or mailto:a.b+c@d.example.org",
        "http://www.example.com/www.example.net",
        PIXEL,
    ],
)
def test_plain_text_never_becomes_a_link_and_reads_the_same(text: str) -> None:
    assert autolinks(text)  # as typed, GFM would link it
    escaped = ui.plain(text)
    assert autolinks(escaped) == []
    assert shown(escaped) == text


@pytest.mark.parametrize(
    ("page", "button"), [("pages/live.py", None), ("pages/runs.py", "runs.compare")]
)
def test_a_run_name_with_a_bare_url_is_not_a_link(
    store: RunStore, page: str, button: str | None
) -> None:
    (run_id,) = fakes.populate(store, n_runs=1, n_steps=20, n_layer=1, probe_every=10)
    name = store.rename_run(run_id, "notes from www.example.org")  # sanitize_name keeps it
    at = open_page(page, run_id=run_id)
    if button:  # Runs shows the name in Markdown in the message an action leaves
        at.button(key=button).click().run()
    assert not at.exception, [e.value for e in at.exception]
    quoting = [text for text in markdown_texts(at) if "example" in text]
    assert quoting  # the name is shown...
    for text in quoting:  # ...as typed, and not as a link
        assert autolinks(text) == [], text
        assert name in shown(text)


@pytest.mark.parametrize("page", ["pages/train.py", "pages/compare.py", "pages/parameters.py"])
def test_pages_show_user_text_as_plain_text(evil: dict[str, int], page: str) -> None:
    at = open_page(page, compare_ids=sorted(evil.values()))
    assert_no_active_markdown(at)


def test_train_progress_shows_the_name_as_typed(store: RunStore, evil: dict[str, int]) -> None:
    at = open_page("pages/train.py")
    (bar,) = at.get("progress")
    name = store.get_run(evil["running"]).name
    assert name in shown(bar.proto.text)
    assert_no_active_markdown(at)


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("page", ["pages/live.py", "pages/runs.py"])
def test_live_and_runs_show_names_and_errors_as_plain_text(
    store: RunStore, evil: dict[str, int], page: str, status: str
) -> None:
    run_id = evil[status]
    at = open_page(page, run_id=run_id)
    assert_no_active_markdown(at)
    name = store.get_run(run_id).name
    if page == "pages/live.py":
        assert [shown(h.value) for h in at.subheader][:1] == [f"#{run_id} {name}"]
    else:  # the selected row of the table, whose cells are plain text
        assert selected_rows(at) == [run_id]
        assert at.dataframe(key=TABLE_KEY).value.set_index("id").loc[run_id, "name"] == name
    if status in ("failed", "diverged"):
        assert any(f"RuntimeError: {EVIL}" in shown(e.value) for e in at.error)


def test_live_samples_tab_is_plain_text(evil: dict[str, int]) -> None:
    at = open_page("pages/live.py", run_id=evil["completed"], **{"live.tab": "Samples"})
    assert at.code  # the samples themselves: verbatim
    assert_no_active_markdown(at)


def test_a_markdown_query_param_is_shown_as_text(evil: dict[str, int]) -> None:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["run"] = PIXEL
    at.switch_page("pages/live.py").run()
    assert_no_active_markdown(at)
    assert any(f"?run={PIXEL}: not a run id" in shown(w.value) for w in at.warning)


def test_runs_page_flash_after_add_to_compare_is_plain_text(
    store: RunStore, evil: dict[str, int]
) -> None:
    at = open_page("pages/runs.py", run_id=evil["completed"])
    at.button(key="runs.compare").click().run()
    assert_no_active_markdown(at)
    name = store.get_run(evil["completed"]).name
    assert any(name in shown(s.value) for s in at.success)


def _guarded_failure() -> None:
    from blockviz.dashboard import ui

    with ui.guard("Loading"):
        raise ValueError("cannot read ![t](http://127.0.0.1:9/p.png) **now**")


def _flashed() -> None:
    import streamlit as st

    from blockviz.dashboard import ui

    if not st.session_state.get("flashed"):
        st.session_state["flashed"] = True
        ui.flash("success", "Deleted run #3 (![t](http://127.0.0.1:9/p.png)).")
        st.rerun()
    ui.show_flashes()


@pytest.mark.parametrize("script", [_guarded_failure, _flashed])
def test_ui_helpers_show_messages_as_plain_text(script: Any) -> None:
    at = AppTest.from_function(script, default_timeout=TIMEOUT).run()
    assert_no_active_markdown(at)
    messages = [shown(e.value) for e in [*at.error, *at.success]]
    assert any(PIXEL in m for m in messages), messages


@pytest.mark.parametrize(
    "text", ["plain", "a `tick`", "``", "`edge", "line\nbreak", "![t](http://x/y.png)"]
)
def test_literal_is_one_code_span_that_keeps_the_text(text: str) -> None:
    span = ui.literal(text)
    fence = re.match(r"`+", span).group(0)
    assert span.endswith(fence) and f"{fence}`" not in span  # no longer run inside
    inside = span[len(fence) : -len(fence)]
    if inside.startswith(" ") and inside.endswith(" ") and inside.strip():
        inside = inside[1:-1]  # CommonMark strips one padding space from each side
    assert inside == " ".join(text.split())
