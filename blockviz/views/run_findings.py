"""A run's findings read from the store, and written out: plain text, JSON and tables.

The rules are `core.findings` (pure); this module reads what they need from the store (the
whole series, not downsampled: a spike or a diverged step must not be averaged away), keeps
each run's findings while nothing new was logged, and writes them for the `show` command,
the report, Compare, a study's page and Live (whose panel escapes them for Markdown).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from blockviz.core import spec
from blockviz.core.divergence import format_nonfinite
from blockviz.core.findings import evaluate
from blockviz.core.findings.base import Finding, RunSeries, Suggestion, run_series
from blockviz.core.findings.training import headline

if TYPE_CHECKING:
    from blockviz.store import ForkInfo, RunRecord, RunStore

# What the rules read: scalars by name, and per-layer statistics by kind, component, stat.
# (train/grad_norm too: a divergence's story names every scalar that went non-finite.)
SCALARS = (spec.TRAIN_LOSS, spec.VAL_LOSS, spec.TRAIN_LR, spec.TRAIN_GRAD_NORM, *spec.PROBE_SCALARS)
LAYER_READS: tuple[dict[str, Any], ...] = (
    {
        "kind": "component",
        "component": ("block", spec.WEIGHTS_COMPONENT),
        "stat": (spec.GRAD_NORM, spec.UPDATE_RATIO),
    },
    {
        "kind": "tap",
        "component": spec.STREAM_TAP,
        "stat": (*spec.STREAM_STATS, spec.MAX_ABS, spec.RMS),
    },
    {"kind": "tap", "component": spec.FFN_TAP, "stat": spec.FFN_UNIT_STATS},
    {"kind": "head", "stat": spec.HEAD_STATS},
)


@dataclass(frozen=True)
class RunFindings:
    """A run's headline and its findings (newest first)."""

    headline: Finding
    findings: list[Finding]
    step: int | None = None  # the newest step the rules read (None: nothing logged)

    @property
    def titles(self) -> list[str]:
        """The headline, then each warning's or error's title and, when checks could not be
        made, how many: a table cell's worth."""
        rest = [f.title for f in self.findings if f.severity in ("error", "warning") or unsure(f)]
        return [self.headline.title, *(t for t in rest if t != self.headline.title)]


def unsure(finding: Finding) -> bool:
    """Whether a finding is the healthy one, saying that some checks could not be made."""
    return finding.rule == "healthy" and finding.severity != "ok"


def read_layers(store: RunStore, run_id: int) -> pd.DataFrame:
    """The per-layer statistics the rules read, whole."""
    frames = [store.layer_stats(run_id, **read) for read in LAYER_READS]
    frames = [frame for frame in frames if not frame.empty]
    return pd.concat(frames, ignore_index=True) if frames else store.layer_stats(run_id, kind=())


def findings_of(
    run: RunRecord,
    scalars: pd.DataFrame,
    layers: pd.DataFrame,
    replays: tuple[ForkInfo, ...] = (),
) -> RunFindings:
    """The findings of a run from its row, the frames the rules read and what its replays
    found."""
    series: RunSeries = run_series(run, scalars, layers, replays)
    found = evaluate(series)
    newest = int(scalars["step"].max()) if not scalars.empty else None
    return RunFindings(headline(series, found), found, newest)


def read_findings(store: RunStore, run: RunRecord) -> RunFindings:
    """The findings of a stored run, read from the store."""
    run_id = int(run.id)
    scalars = store.scalars(run_id, names=SCALARS)
    return findings_of(run, scalars, read_layers(store, run_id), replay_results(store, run_id))


def replay_results(store: RunStore, run_id: int) -> tuple[ForkInfo, ...]:
    """What each finished replay of the run found (training.replay), oldest first."""
    infos = (replay.fork_info or {} for replay in store.twins_of(run_id, "replay"))
    return tuple(info for info in infos if info.get("sentence"))


# Findings of runs by (store file, run id, status, step): a finished run's never change, a
# running run's key moves with its step. Pages that list many runs (Compare, a study of 42
# runs refreshing every 5 s) read each run once per change, not once per redraw.
_CACHE: dict[tuple[str, int, str, Any, tuple[tuple[int, int], ...]], RunFindings] = {}
_CACHE_SIZE = 1024
_CACHE_LOCK = threading.Lock()  # the dashboard's sessions are threads of one process
ACTIVE_EVERY_S = 5.0


def cached_findings(store: RunStore, run: RunRecord, logged: bool | None = None) -> RunFindings:
    """`read_findings`, kept while the run's status and step stay the same; a run still
    training is read again at most every ACTIVE_EVERY_S seconds (its step moves at every
    log, and a long run's whole series take a while to read). `logged`, when the caller
    knows it, says whether the run has logged anything yet: the first logged step is read
    at once, so a page never says "no loss yet" beside a chart with points."""
    step: Any = run.step
    if str(run.status) in spec.ACTIVE_STATUSES:
        step = ("active", int(time.monotonic() // ACTIVE_EVERY_S), logged)
    # A replay finishing later (or deleted) changes a run's spike or divergence finding.
    key = (store.where, int(run.id), str(run.status), step, store.replays_stamp(int(run.id)))
    with _CACHE_LOCK:
        found = _CACHE.get(key)
    if found is None:
        found = read_findings(store, run)
        with _CACHE_LOCK:
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))  # the oldest entry
            _CACHE[key] = found
    return found


def titles_text(found: RunFindings) -> str:
    """The headline and each warning's or error's title, in one cell: 'A; B; C'."""
    return "; ".join(found.titles)


def findings_column(store: RunStore, run_ids: Sequence[int]) -> list[str]:
    """`titles_text` of each run (cached): a findings column for a table of runs."""
    return [titles_text(cached_findings(store, store.get_run(int(i)))) for i in run_ids]


def suggestion_text(tip: Suggestion | None) -> str:
    """What to try, with where the idea comes from: 'Clip the gradient norm at 1.
    (Pascanu et al. 2013)'; '' for none."""
    if tip is None:
        return ""
    return f"{tip.text} ({tip.source})" if tip.source else tip.text


def finding_text(finding: Finding) -> str:
    """The finding's sentences, and what to try."""
    if finding.suggestion is None:
        return finding.text
    return f"{finding.text} Try: {suggestion_text(finding.suggestion)}"


def plain_lines(found: RunFindings) -> list[str]:
    """The findings as plain text lines: the headline first, then each finding."""
    head = found.headline
    # The headline first; a diverged or stalled one is also a finding, told in full below.
    lines = [f"{head.title}: {finding_text(head)}" if head.rule == "state" else head.title]
    for finding in found.findings:
        lines.append(f"[{finding.severity}] {finding.title}: {finding_text(finding)}")
    return lines


def _json_safe(value: Any) -> Any:
    """Evidence as JSON takes it: non-finite floats as 'NaN' / '+inf' / '-inf' text."""
    if isinstance(value, float) and not math.isfinite(value):
        return format_nonfinite(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def finding_json(finding: Finding) -> dict[str, Any]:
    """A finding as a JSON-ready dict (its tab too)."""
    return _json_safe({**asdict(finding), "tab": finding.tab})


def findings_table(entries: Sequence[tuple[str, RunFindings]]) -> pd.DataFrame:
    """One row per finding of each run: run, severity, rule, step, title, text, suggestion."""
    rows = []
    for name, found in entries:
        for finding in [found.headline, *found.findings]:  # a headline finding comes once
            rows.append(
                {
                    "run": name,
                    "severity": finding.severity,
                    "rule": finding.rule,
                    "step": "" if finding.step is None else str(finding.step),
                    "title": finding.title,
                    "text": finding.text,
                    "suggestion": suggestion_text(finding.suggestion),
                }
            )
    columns = ["run", "severity", "rule", "step", "title", "text", "suggestion"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.drop_duplicates(["run", "rule", "title"])
