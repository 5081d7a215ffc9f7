"""One vocabulary: every metric name is spelled once, in core/spec.py's registry.

The code under blockviz/ and pages/ names a metric by its constant (spec.TRAIN_LOSS,
spec.GRAD_NORM, ...) or reads it from one of the registry's tuples; a string literal equal
to a registered name anywhere else fails here, unless the allow-list below says why it
stays. Prose that mentions a name inside a longer text (docstrings, comments) is no such
literal and passes; help text shown to users builds the names it mentions from the
constants in f-strings (Live's Activations help, the ops dataset note).
"""

from __future__ import annotations

import ast
from pathlib import Path

from blockviz.core import spec

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("blockviz", "pages")
REGISTRY = Path(spec.__file__).resolve()  # where each name is spelled, once

# Files left out whole, by file name (names survive a move into another package).
EXEMPT_FILES = {
    # The exported training script is torch only and must run without blockviz installed:
    # it cannot import the registry, so whatever names it prints it spells itself.
    "codegen_template.py",
}
# Literals that are no metric name but happen to spell one: (path, literal) -> why.
ALLOWED = {
    # Seed bands and the per-variant table have a column "mean" (the mean over seeds).
    ("blockviz/views/seed_groups.py", spec.MEAN): "BAND_COLUMNS' mean over a group's seeds",
    ("blockviz/views/studies/charts.py", spec.MEAN): "the band frame's mean column",
    ("blockviz/core/studies/summary.py", spec.MEAN): "the per-variant table's mean over seeds",
}


def _python_files() -> list[Path]:
    files = []
    for folder in SCANNED:
        files += sorted((ROOT / folder).rglob("*.py"))
    return [p for p in files if p.resolve() != REGISTRY and p.name not in EXEMPT_FILES]


def metric_literals() -> list[tuple[str, int, str]]:
    """(path, line, name) of every string constant that equals a registered metric name."""
    names = set(spec.METRICS)
    found = []
    for path in _python_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            where = path.relative_to(ROOT).as_posix()
            if node.value in names and (where, node.value) not in ALLOWED:
                found.append((str(path.relative_to(ROOT)), node.lineno, node.value))
    return sorted(found)


def test_no_metric_name_is_spelled_outside_the_registry() -> None:
    found = metric_literals()
    listing = "\n".join(f"{path}:{line}: {name!r}" for path, line, name in found)
    assert not found, (
        f"{len(found)} metric names spelled as literals; use core.spec's constants:\n{listing}"
    )


def test_every_allowance_is_still_needed() -> None:
    """An allow-list entry whose literal has gone is removed with it."""
    for where, literal in ALLOWED:
        assert (ROOT / where).is_file(), where
        tree = ast.parse((ROOT / where).read_text(encoding="utf-8"))
        literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
        assert literal in literals, (where, literal)
    for file_name in EXEMPT_FILES:
        assert list((ROOT / "blockviz").rglob(file_name)), file_name


def test_the_registry_is_well_formed() -> None:
    for name, metric in spec.METRICS.items():
        assert metric.name == name
        assert metric.family in spec.FAMILIES, metric
        assert metric.scope in spec.SCOPES, metric
        assert metric.label, metric
        assert ("/" in name) == (metric.scope == "scalar"), metric
        # Its constant is its name in capitals, "/" read as "_": spec.TRAIN_LOSS, spec.RMS.
        assert getattr(spec, name.upper().replace("/", "_")) == name


def test_the_tuples_are_views_of_the_registry() -> None:
    assert spec.TAP_STATS == (
        spec.MEAN,
        spec.STD,
        spec.RMS,
        spec.MAX_ABS,
        spec.ZERO_FRAC,
        spec.BELOW_RANGE,
        spec.ABOVE_RANGE,
    )
    assert spec.STREAM_STATS == (spec.TOKEN_COS, spec.MAX_OVER_MEDIAN)
    assert spec.FFN_UNIT_STATS == (spec.DEAD_FRAC,)
    assert spec.COMPONENT_STATS == (spec.GRAD_NORM, spec.PARAM_NORM, spec.UPDATE_RATIO)
    attention = (spec.ATTN_ENTROPY, spec.ATTN_LOGIT_MAX, spec.ATTN_LOGIT_MAX_ABS)
    assert attention == spec.ATTENTION_HEAD_STATS
    assert spec.INDUCTION_STATS == (spec.PREFIX_SCORE, spec.PREFIX_SCORE_SE, spec.COPY_SCORE)
    assert (*attention, *spec.INDUCTION_STATS) == spec.HEAD_STATS
    assert set(spec.LOG_HEAD_STATS) <= set(spec.ATTENTION_HEAD_STATS)
    assert spec.PROBE_SCALARS == (spec.PROBE_LOGIT_MAX_ABS, spec.PROBE_LOG_Z)
    assert set(spec.LOSS_NAMES) <= set(spec.metric_names("scalar", "loss"))
    assert set(spec.SCALARS) | set(spec.STAT_LABELS) == set(spec.METRICS)
    for name, metric in spec.METRICS.items():
        label = spec.scalar_label(name) if metric.scope == "scalar" else spec.stat_label(name)
        assert label == metric.label
    assert spec.stat_label("no such statistic") == "no such statistic"
