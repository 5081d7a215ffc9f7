"""Streamlit helpers shared by every page: safe text, error guards, chart downloads, run picking.

Pages stay thin by leaning on these (the store itself: `store_access`). Nothing here
imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from blockviz.core.naming import is_id_text, run_id_from_text, shortened_id
from blockviz.launch import runner
from blockviz.store import RunStore
from blockviz.views.charts.marks import defines_param
from blockviz.views.export.outfolder import safe_filename
from blockviz.views.export.render import chart_html, chart_png, chart_svg

LIVE_PAGE = "pages/live.py"
RUN_KEY = "run_id"  # session_state key of the run the Live page shows
COMPARE_KEY = "compare_ids"  # session_state key of the runs the Compare page overlays
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
WORD_JOINER = "\u2060"  # invisible; neither space nor punctuation, so no autolink starts at it
# Where GFM's literal autolinks start: `http://`, `https://`, `www.`, and the `@` of an
# email. Streamlit finds them in the text left after escapes, so a backslash cannot stop them.
_AUTOLINK_START = re.compile(r"https?(?=://)|www(?=\.)|@", re.IGNORECASE)


def plain(text: object) -> str:
    """User text made safe inside Streamlit Markdown: shown as typed, never interpreted.

    Every ASCII punctuation character gets a backslash (CommonMark lets any of them be
    escaped), so `![t](http://...)` stays text instead of becoming an image the browser
    fetches, and `:red[...]`, `$...$`, `**` or `<b>` stay literal; line breaks become
    spaces so a name cannot start a heading or a list. A word joiner after `http`, `www`
    and `@` keeps a bare URL or email from becoming a link, and reads the same.
    """
    flat = " ".join(str(text).split())
    unlinked = _AUTOLINK_START.sub(lambda start: start.group() + WORD_JOINER, flat)
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", unlinked)


def literal(text: object) -> str:
    """Text as an inline code span (a path, a value) that no character can break out of.

    The fence is one backtick longer than the longest run of backticks inside; a space
    pads text that starts or ends with a backtick (CommonMark strips one from each side).
    """
    flat = " ".join(str(text).split()) or " "
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat[0] == "`" or flat[-1] == "`" else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


_KEY_CLASS = re.compile(r"[A-Za-z0-9_-]+")


def scroll_into_view(key: str, token: int) -> None:
    """Scroll the page so the container made with `st.container(key=key)` is at the top,
    once per `token` in this browser tab: the script may come again on every run, and it
    scrolls only for a token it has not scrolled for yet.

    Streamlit gives such a container the class `st-key-<key>`; the script looks it up a
    moment after this run is drawn. `key` is the page's own constant, never user text.
    """
    if not _KEY_CLASS.fullmatch(key):
        raise ValueError(f"scroll_into_view: {key!r} is not a plain container key")
    mark = f"{key}:{int(token)}"
    # scroll-margin-top keeps the target clear of Streamlit's header bar. The jump is
    # instant: a smooth scroll is cancelled part-way when the page redraws under it (Live
    # refreshes itself while its run trains).
    st.html(
        "<script>setTimeout(() => { const box = document.querySelector('.st-key-" + key + "');"
        " if (box && window.blockvizScrolled !== '" + mark + "') {"
        " window.blockvizScrolled = '" + mark + "'; box.style.scrollMarginTop = '4rem';"
        " box.scrollIntoView({behavior: 'instant', block: 'start'}); } }, 300);</script>",
        unsafe_allow_javascript=True,
    )


@contextmanager
def guard(label: str) -> Iterator[None]:
    """Turn any exception inside into a one-line st.error (details folded away)."""
    try:
        yield
    except Exception as exc:  # Streamlit's stop/rerun are BaseExceptions and pass through
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        st.error(f"{plain(label)}: {plain(message)}")
        with st.expander("details"):
            st.code(f"{type(exc).__name__}: {exc}", language=None)


DOWNLOAD_MENU = "Download"


def _download(
    label: str, build: Callable[[], bytes | str], file_name: str, mime: str, key: str
) -> None:
    st.download_button(
        label,
        data=build,  # a callable runs only on click: no export cost per refresh
        file_name=file_name,
        mime=mime,
        key=key,
        on_click="ignore",
        icon=":material/download:",
        width="stretch",
    )


def chart_with_downloads(
    chart: alt.TopLevelMixin,
    data: pd.DataFrame,
    name: str,
    key: str,
    selection: str | None = None,
) -> Any:
    """The chart, stretched to the container, with one compact "Download" menu under it
    holding PNG (2x), SVG, HTML and CSV; a chart with no data ("no data yet") gets none.

    Each file is built only when its button is clicked (vl-convert renders PNG and SVG
    then), so neither the menu nor a refresh costs an export. With `selection` (a selection
    parameter of the chart) a click reruns the page and the selection event is returned; a
    chart drawn without it (a placeholder before the first step) is drawn without picking,
    since Streamlit refuses a selection mode its spec does not define.
    """
    picking = (
        {"on_select": "rerun", "selection_mode": [selection]}
        if selection and defines_param(chart, selection)
        else {}
    )
    event = st.altair_chart(chart, width="stretch", key=f"{key}.chart", **picking)
    if data.empty:
        return event
    with st.popover(DOWNLOAD_MENU, icon=":material/download:", key=f"{key}.menu"):
        _download(
            "PNG",
            lambda: chart_png(chart, scale=2),
            safe_filename(name, "png"),
            "image/png",
            f"{key}.png",
        )
        _download(
            "SVG",
            lambda: chart_svg(chart),
            safe_filename(name, "svg"),
            "image/svg+xml",
            f"{key}.svg",
        )
        _download(
            "HTML",
            lambda: chart_html(chart),
            safe_filename(name, "html"),
            "text/html",
            f"{key}.html",
        )
        _download(
            "CSV",
            lambda: data.to_csv(index=False),
            safe_filename(name, "csv"),
            "text/csv",
            f"{key}.csv",
        )
    return event


def selected_run_id() -> int | None:
    """The run chosen on any page: the `?run=ID` query param, then session state.

    `select_run` writes both, so they differ only when a link (`?run=ID`, such as Live's
    notice of a new fork) brought the user here: the link wins and becomes the session's
    choice. A `?run=` that is not an id (`?run=²`, `?run=abc`) selects nothing by itself;
    see `selection_notice` for the message.
    """
    run_id = run_id_from_text(_run_param().strip())
    if run_id is not None:
        if st.session_state.get(RUN_KEY) != run_id:
            # Written again: a page link within the session leaves the address bar on the
            # page it came from until the server sets the parameter.
            select_run(run_id)
        return run_id
    chosen = st.session_state.get(RUN_KEY)
    return chosen if isinstance(chosen, int) else None


def _run_param() -> str:
    text = st.query_params.get("run", "")
    return text if isinstance(text, str) else ""


def selection_notice(runs: pd.DataFrame) -> str | None:
    """Why the chosen run cannot be shown (plain text), or None when it can or none is chosen.

    Call before `current_run` / `run_picker`, which replace a bad choice by the newest run.
    """
    if runs.empty:
        return None
    newest = int(runs["id"].iloc[-1])
    chosen = selected_run_id()
    if chosen in {int(i) for i in runs["id"]}:
        return None
    text = _run_param()
    if chosen is None and not is_id_text(text.strip()):
        if text:
            return (
                f"?run={text}: not a run id; showing the newest run (#{newest}), "
                "pick another below."
            )
        return None
    # Digits past any id a store can hold (`run_id_from_text` gives None) are such a run.
    named = chosen if chosen is not None else shortened_id(text.strip())
    return (
        f"Run #{named} is not in this store (deleted, or never created); showing the "
        f"newest run (#{newest}), pick another below."
    )


def current_run(runs: pd.DataFrame) -> int | None:
    """The run to show: the selected one if it exists, else the newest (now selected)."""
    if runs.empty:
        return None
    ids = {int(i) for i in runs["id"]}
    current = selected_run_id()
    if current not in ids:
        current = int(runs["id"].iloc[-1])  # the newest run: usually the one just launched
        select_run(current)
    return current


def select_run(run_id: int | None) -> None:
    """Make `run_id` the selected run for every page (and the URL, so a reload keeps it)."""
    if run_id is None:
        st.session_state.pop(RUN_KEY, None)
        st.query_params.pop("run", None)
        return
    st.session_state[RUN_KEY] = int(run_id)
    st.query_params["run"] = str(int(run_id))


def open_in_live(run_id: int) -> None:
    """Select the run and switch to the Live page."""
    select_run(run_id)
    st.switch_page(LIVE_PAGE, query_params={"run": str(int(run_id))})


def add_to_compare(run_id: int) -> None:
    """Add a run to the Compare page's selection (kept in session state)."""
    chosen = [int(i) for i in st.session_state.get(COMPARE_KEY, [])]
    if int(run_id) not in chosen:
        chosen.append(int(run_id))
    st.session_state[COMPARE_KEY] = chosen


def run_statuses(runs: pd.DataFrame) -> dict[int, str]:
    """{run id: status}: what a page compares between refreshes to notice a change."""
    return {int(i): str(s) for i, s in zip(runs["id"], runs["status"], strict=True)}


def run_label(row: pd.Series | dict, word: str | None = None) -> str:
    """'#id name (state)': how a run is named in pickers, its state the word every page
    shows it by (`word`, from `runner.shown_in`; default: its stored status).

    Plain text, as selectbox and multiselect options show it (only their labels take
    Markdown); wrap it in `plain` before it goes anywhere that renders Markdown.
    """
    return f"#{int(row['id'])} {row['name']} ({word or row['status']})"


def _sync_single(key: str) -> None:
    select_run(st.session_state.get(key))


def _sync_multi(key: str) -> None:
    st.session_state[COMPARE_KEY] = [int(i) for i in st.session_state.get(key, [])]


def run_picker(
    store: RunStore,
    label: str,
    multi: bool,
    key: str,
    runs: pd.DataFrame | None = None,
    every_run: pd.DataFrame | None = None,
) -> int | list[int] | None:
    """Pick one run (int or None) or several (list) by '#id name (state)'.

    The choice is shared across pages: one run via session_state["run_id"] (and `?run=`),
    several via session_state["compare_ids"]; callbacks copy a change there before the
    next run, so the shared value is always the one to show. `runs` is the page's own
    read of store.runs_frame() (or the runs it offers), so the labels show the states the
    page shows; `every_run` is the whole store's read when `runs` is filtered (a queued
    run's word depends on every run ahead of it).
    """
    runs = store.runs_frame() if runs is None else runs
    words = runner.shown_in(runs if every_run is None else every_run)
    ids = [int(i) for i in runs["id"]]
    labels = {
        int(row["id"]): run_label(row, words.get(int(row["id"]))) for _, row in runs.iterrows()
    }

    def fmt(run_id: int) -> str:
        return labels.get(run_id, f"#{run_id} (deleted)")

    if multi:
        wanted = st.session_state.get(COMPARE_KEY, [])
        # Runs deleted since they were picked drop out instead of breaking the widget.
        st.session_state[key] = [int(i) for i in wanted if int(i) in labels]
        st.session_state[COMPARE_KEY] = st.session_state[key]
        chosen = st.multiselect(
            label, ids, key=key, format_func=fmt, on_change=_sync_multi, args=(key,)
        )
        return [int(i) for i in chosen]
    current = current_run(runs)
    if current is None:
        return None
    st.session_state[key] = current
    chosen_id = st.selectbox(
        label, ids, key=key, format_func=fmt, on_change=_sync_single, args=(key,)
    )
    return None if chosen_id is None else int(chosen_id)


def format_duration(seconds: float | None) -> str:
    """'42s', '3m 05s', '1h 02m'; '—' when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "—"
    whole = round(float(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def flash(kind: str, message: str) -> None:
    """Queue a plain-text message for the next run of the page (survives st.rerun)."""
    st.session_state.setdefault("_flash", []).append((kind, message))


def show_flashes() -> None:
    """Show and clear the queued messages, as plain text (they carry run names)."""
    for kind, message in st.session_state.pop("_flash", []):
        {"success": st.success, "error": st.error, "warning": st.warning}.get(kind, st.info)(
            plain(message)
        )
