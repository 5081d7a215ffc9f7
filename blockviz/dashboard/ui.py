"""Streamlit helpers shared by every page: the store, error guards, chart downloads, run picking.

Pages stay thin by leaning on these. Nothing here imports torch.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st

from blockviz import runner
from blockviz.core.config import ModelConfig
from blockviz.core.params import Breakdown
from blockviz.core.spec import ACTIVE_STATUSES, layer_label
from blockviz.store import (
    RunStore,
    StoreError,
    StoreLocked,
    checked,
    default_store_path,
    is_id_text,
    is_readonly_error,
)
from blockviz.views import export

LIVE_PAGE = "pages/live.py"
RUN_KEY = "run_id"  # session_state key of the run the Live page shows
PAGE_BUSY_TIMEOUT_S = 5.0  # a locked store: the page says so after this, never hangs
COMPARE_KEY = "compare_ids"  # session_state key of the runs the Compare page overlays
REAP_EVERY_S = 5.0  # pages mark dead runs failed at most this often (fragments refresh faster)
READONLY_NOTICE = "read-only store: launching, stopping, renaming and deleting are off"
# What RunStore says when the file or its folder cannot be written (then: open read-only).
_MARKDOWN_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def plain(text: object) -> str:
    """User text made safe inside Streamlit Markdown: shown as typed, never interpreted.

    Every ASCII punctuation character gets a backslash (CommonMark lets any of them be
    escaped), so `![t](http://...)` stays text instead of becoming an image the browser
    fetches, and `:red[...]`, `$...$`, `**` or `<b>` stay literal; line breaks become
    spaces so a name cannot start a heading or a list.
    """
    flat = " ".join(str(text).split())
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", flat)


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


@st.cache_resource(show_spinner=False)
def _open_store(path: str) -> RunStore:
    # One connection per store file for the whole server; RunStore serialises threads.
    # A damaged file is refused once, when it is opened, rather than misread page by page.
    return checked(_open_read_or_write(path))


def _open_read_or_write(path: str) -> RunStore:
    try:
        return RunStore(path, busy_timeout_s=PAGE_BUSY_TIMEOUT_S)
    except StoreLocked:
        raise
    except StoreError as exc:
        # A store this process may read but not write (a read-only file or folder, a
        # copy from another user): show it, with the actions that write turned off.
        # (RunStore.open_readable does the same; this goes through the module's RunStore
        # name so the page tests can stand in for the file system.)
        if not Path(path).is_file() or not is_readonly_error(exc):
            raise
        try:
            return RunStore(path, readonly=True, busy_timeout_s=PAGE_BUSY_TIMEOUT_S)
        except StoreError:
            raise exc from None  # the first error says why writing was refused


_rerouted = False  # whether run_via_app has rerun a page run already (once per process)


def run_via_app() -> None:
    """Rerun through app.py when Streamlit ran a page file on its own.

    A Streamlit quirk: until some run of the server has called st.navigation, a main
    script that sits next to a `pages/` folder gets the old multipage behaviour, in which
    a `/<page>` URL runs that page file alone, without app.py's navigation, page config and
    sidebar. That is the first visit after a (re)start that opens a page link, such as a
    bookmarked `/live?run=3`. Turning the old behaviour off and rerunning sends the run
    through app.py. Every page reaches this early (via the store or the sidebar).

    The rerun happens once per process: a server keeps the switch off from then on, while
    AppTest turns it back on for every run, and a rerun there would swallow the click
    that started the run.
    """
    global _rerouted
    try:
        from streamlit.runtime.pages_manager import PagesManager
    except ImportError:  # a future Streamlit without the switch: nothing to undo
        return
    if getattr(PagesManager, "uses_pages_directory", False):
        PagesManager.uses_pages_directory = False
        if not _rerouted:
            _rerouted = True
            st.rerun()


def store_path() -> Path:
    """The store file the dashboard uses ($BLOCKVIZ_STORE or runs/blockviz.db), absolute."""
    return default_store_path().expanduser().absolute()


def get_store() -> RunStore | None:
    """The cached RunStore, or None (showing nothing) when it cannot be opened."""
    run_via_app()
    try:
        return _open_store(str(store_path()))
    except (StoreError, OSError):
        return None


def store_or_stop() -> RunStore:
    """The cached RunStore; otherwise a clear error naming the path, and the page stops."""
    run_via_app()
    path = store_path()
    try:
        return _open_store(str(path))
    except (StoreError, OSError) as exc:
        if isinstance(exc, StoreLocked):
            advice = "Reload the page to try again."
        else:
            advice = "Set `BLOCKVIZ_STORE` to a writable file path and restart the app."
        st.error(f"Cannot open the run store at {literal(path)}: {plain(exc)}. {advice}")
        st.stop()
        raise  # unreachable: st.stop() raises; keeps type checkers honest


def writable(store: RunStore | None) -> bool:
    """Whether launching, stopping, renaming and deleting may write to this store."""
    return store is not None and not store.readonly


def store_notice(store: RunStore | None) -> None:
    """The one-line notice a read-only store gets on every page that uses it."""
    if store is not None and store.readonly:
        st.info(READONLY_NOTICE, icon=":material/lock:")


_last_reap: dict[str, float] = {}  # store path -> monotonic time of this process's last reap


def reap_dead(store: RunStore) -> None:
    """Mark runs whose process died (kill -9, out of memory) as failed; called on refreshes.

    At most once per REAP_EVERY_S per store, so a page refreshing every 1.5 s does not
    query process tables that often; a dead run reads `failed` within its 30 s heartbeat
    staleness plus this. A read-only store is never written. Best effort: a store that
    cannot be written right now is tried again on a later refresh, while the page reads on.
    """
    if store.readonly:
        return
    now = time.monotonic()
    key = str(store.path)
    last = _last_reap.get(key)
    if last is not None and now - last < REAP_EVERY_S:
        return
    _last_reap[key] = now
    with suppress(StoreError):
        runner.reap(store)  # also collects the dashboard's own exited children


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
    )


def chart_with_downloads(chart: alt.TopLevelMixin, data: pd.DataFrame, name: str, key: str) -> None:
    """The chart, stretched to the container, with PNG (2x), SVG, HTML and CSV downloads."""
    st.altair_chart(chart, width="stretch", key=f"{key}.chart")
    with st.container(horizontal=True, gap="small"):
        _download(
            "PNG",
            lambda: export.chart_png(chart, scale=2),
            export.safe_filename(name, "png"),
            "image/png",
            f"{key}.png",
        )
        _download(
            "SVG",
            lambda: export.chart_svg(chart),
            export.safe_filename(name, "svg"),
            "image/svg+xml",
            f"{key}.svg",
        )
        _download(
            "HTML",
            lambda: export.chart_html(chart),
            export.safe_filename(name, "html"),
            "text/html",
            f"{key}.html",
        )
        _download(
            "CSV",
            lambda: data.to_csv(index=False),
            export.safe_filename(name, "csv"),
            "text/csv",
            f"{key}.csv",
        )


def selected_run_id() -> int | None:
    """The run chosen on any page: session state first, then the `?run=ID` query param.

    A `?run=` that is not an id (`?run=²`, `?run=abc`) selects nothing; see
    `selection_notice` for the message.
    """
    chosen = st.session_state.get(RUN_KEY)
    if isinstance(chosen, int):
        return chosen
    text = st.query_params.get("run", "")
    if isinstance(text, str) and is_id_text(text.strip()):
        st.session_state[RUN_KEY] = int(text)
        return int(text)
    return None


def selection_notice(runs: pd.DataFrame) -> str | None:
    """Why the chosen run cannot be shown (plain text), or None when it can or none is chosen.

    Call before `current_run` / `run_picker`, which replace a bad choice by the newest run.
    """
    if runs.empty:
        return None
    newest = int(runs["id"].iloc[-1])
    chosen = selected_run_id()
    if chosen is None:
        text = st.query_params.get("run", "")
        if isinstance(text, str) and text:
            return (
                f"?run={text}: not a run id; showing the newest run (#{newest}), "
                "pick another below."
            )
        return None
    if chosen not in {int(i) for i in runs["id"]}:
        return (
            f"Run #{chosen} is not in this store (deleted, or never created); showing the "
            f"newest run (#{newest}), pick another below."
        )
    return None


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


def run_label(row: pd.Series | dict) -> str:
    """'#id name (status)': how a run is named in pickers.

    Plain text, as selectbox and multiselect options show it (only their labels take
    Markdown); wrap it in `plain` before it goes anywhere that renders Markdown.
    """
    return f"#{int(row['id'])} {row['name']} ({row['status']})"


def _sync_single(key: str) -> None:
    select_run(st.session_state.get(key))


def _sync_multi(key: str) -> None:
    st.session_state[COMPARE_KEY] = [int(i) for i in st.session_state.get(key, [])]


def run_picker(
    store: RunStore, label: str, multi: bool, key: str, runs: pd.DataFrame | None = None
) -> int | list[int] | None:
    """Pick one run (int or None) or several (list) by '#id name (status)'.

    The choice is shared across pages: one run via session_state["run_id"] (and `?run=`),
    several via session_state["compare_ids"]; callbacks copy a change there before the
    next run, so the shared value is always the one to show. `runs` is the page's own
    read of store.runs_frame(), so the labels show the statuses the page shows.
    """
    runs = store.runs_frame() if runs is None else runs
    ids = [int(i) for i in runs["id"]]
    labels = {int(row["id"]): run_label(row) for _, row in runs.iterrows()}

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


# ------------------------------------------------------------------ parameter breakdown views


def breakdown_frames(
    breakdown: Breakdown, n_layer: int
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per component, per layer and component, every row) frames of a parameter breakdown."""
    rows = pd.DataFrame(
        [
            (r.layer, layer_label(r.layer, n_layer), r.component, r.count, r.formula)
            for r in breakdown.rows
        ],
        columns=["layer_index", "layer", "component", "count", "formula"],
    )
    total = max(breakdown.total, 1)
    components = []
    for component, count in breakdown.by_component().items():
        mine = rows[rows["component"] == component]
        formula = mine["formula"].iloc[0]
        if len(mine) > 1:
            formula = f"{len(mine)} × [{formula}]"
        components.append((component, count, count / total, len(mine), formula))
    by_component = pd.DataFrame(
        components, columns=["component", "count", "share", "layers", "formula"]
    )
    by_layer = rows.sort_values("layer_index", kind="stable")[["layer", "component", "count"]]
    return by_component, by_layer.reset_index(drop=True), rows


def _block_counts(breakdown: Breakdown) -> dict[str, int]:
    """Parameters of one block (all blocks are alike): total, ffn, attn, norm."""
    block = [r for r in breakdown.rows if r.layer == 0]
    counts = {"total": sum(r.count for r in block)}
    for part in ("ffn", "attn", "norm"):
        counts[part] = sum(r.count for r in block if r.component.startswith(part))
    return counts


def block_shares(breakdown: Breakdown) -> dict[str, float]:
    """Fractions of one block's parameters in its FFN, attention and norms."""
    counts = _block_counts(breakdown)
    total = max(counts["total"], 1)
    return {part: counts[part] / total for part in ("ffn", "attn", "norm")}


def share_sentence(model_cfg: ModelConfig, breakdown: Breakdown) -> str:
    """Where the parameters sit, in words computed from the breakdown."""
    counts = _block_counts(breakdown)
    block_total, ffn, attn, norms = (counts[k] for k in ("total", "ffn", "attn", "norm"))
    total = max(breakdown.total, 1)
    blocks_total = sum(r.count for r in breakdown.rows if 0 <= r.layer < model_cfg.n_layer)
    parts = []
    if block_total:
        width = f"ffn_mult {model_cfg.ffn_mult}, {model_cfg.activation}"
        if ffn:
            parts.append(
                f"The FFN holds {ffn / block_total:.1%} of each block's {block_total:,} "
                f"parameters ({ffn:,} at {width})"
            )
        if attn:
            parts.append(f"attention {attn / block_total:.1%} ({attn:,})")
        if norms:
            parts.append(f"norms {norms / block_total:.1%} ({norms:,})")
    sentence = "; ".join(parts) + "." if parts else ""
    rest = total - blocks_total
    return (
        f"{sentence} The {model_cfg.n_layer} blocks hold {blocks_total / total:.1%} of the "
        f"{breakdown.total:,} parameters; embeddings and the head the other {rest / total:.1%}."
    ).strip()


def runs_table(runs: pd.DataFrame, now: float) -> pd.DataFrame:
    """The columns a person scans: id, name, status, created, duration, step, val loss, device.

    Duration runs to `ended`, to `now` for an active run, else to the last heartbeat.
    """
    active = runs["status"].isin(ACTIVE_STATUSES)
    end = runs["ended"].where(runs["ended"].notna(), runs["heartbeat"]).where(~active, now)
    duration = end - runs["started"]
    steps = [
        f"{'–' if pd.isna(step) else f'{int(step):,}'} / "
        f"{'?' if pd.isna(total) else f'{int(total):,}'}"
        for step, total in zip(runs["step"], runs["max_steps"], strict=True)
    ]
    created = [
        "" if pd.isna(c) else time.strftime("%Y-%m-%d %H:%M", time.localtime(c))
        for c in runs["created"]
    ]
    return pd.DataFrame(
        {
            "id": runs["id"].to_numpy(),
            "name": runs["name"].to_numpy(),
            "status": runs["status"].to_numpy(),
            "created": created,
            "duration": [format_duration(None if pd.isna(d) else d) for d in duration],
            "step": steps,
            "val loss": runs["val_loss"].to_numpy(),
            "device": runs["device"].to_numpy(),
        }
    )
