"""A study's results table (the course material's ablation format plus what was measured)
and its verdicts table, as frames and as Markdown / LaTeX / HTML text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from blockviz.core.spec import and_list
from blockviz.core.studies.outcomes import FAILED, outcome_counts
from blockviz.core.studies.summary import OUTCOME_COLUMNS
from blockviz.views.export.ablation import html_table, latex_escape

TABLE_COLUMNS = (
    "Variant",
    "Params",
    "Train loss",
    "Val loss",
    "95% interval",
    "Perplexity",
    "Time",
    "Stability",
)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _loss(mean: float, low: float, high: float) -> str:
    if _missing(mean):
        return ""
    if _missing(low) or _missing(high):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {(high - low) / 2:.3f}"


def results_table(summary: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One row per variant: parameters, train and val loss (mean ± half the 95% interval;
    the value alone with one seed), the interval, perplexity (exp of the mean val loss),
    time relative to the baseline variant and how many seeds failed to train, and how
    (diverged, blew up, stalled)."""
    base = summary.loc[summary["variant"] == baseline, "time_s"]
    base_time = float(base.iloc[0]) if len(base) and not _missing(float(base.iloc[0])) else None
    rows = []
    for row in summary.itertuples(index=False):
        failures = {o: int(getattr(row, OUTCOME_COLUMNS[o])) for o in FAILED}
        failed = sum(failures.values())
        relative = (
            f"{row.time_s / base_time:.2f}×"
            if base_time and not _missing(float(row.time_s))
            else ""
        )
        rows.append(
            {
                "Variant": str(row.variant),
                "Params": "" if _missing(float(row.n_params)) else f"{int(row.n_params):,}",
                "Train loss": "" if _missing(float(row.train_loss)) else f"{row.train_loss:.3f}",
                "Val loss": _loss(float(row.mean), float(row.low), float(row.high)),
                "95% interval": ""
                if _missing(float(row.low))
                else f"{row.low:.3f} to {row.high:.3f}",
                "Perplexity": "" if _missing(float(row.mean)) else f"{math.exp(row.mean):.2f}",
                "Time": relative,
                "Stability": f"{failed} of {int(row.finished)} failed to train"
                + (f" ({outcome_counts(failures)})" if failed else "")
                + (
                    f"; {int(row.runs) - int(row.finished)} not finished"
                    if int(row.runs) > int(row.finished)
                    else ""
                ),
            }
        )
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    return table.rename(columns={"Time": f"Time vs {baseline}"})


def table_markdown(table: pd.DataFrame) -> str:
    """GitHub Markdown; an empty cell reads "—"."""

    def cell(value: Any) -> str:
        text = str(value)
        return text.replace("|", r"\|") if text else "—"

    header = [cell(c) for c in table.columns]
    align = ["---"] + ["---:"] * (len(header) - 1)
    body = [[cell(v) for v in row] for row in table.itertuples(index=False)]
    return "\n".join("| " + " | ".join(r) + " |" for r in [header, align, *body]) + "\n"


def table_latex(table: pd.DataFrame) -> str:
    """A booktabs tabular (first column left, the others right)."""
    spec = "l" + "r" * (len(table.columns) - 1)
    lines = [
        f"\\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(c) for c in table.columns) + r" \\",
        r"\midrule",
        *(
            " & ".join(latex_escape(v) if str(v) else "--" for v in row) + r" \\"
            for row in table.itertuples(index=False)
        ),
        r"\bottomrule",
        r"\end{tabular}",
    ]
    return "\n".join(lines).replace("±", r"$\pm$").replace("×", r"$\times$") + "\n"


def table_html(table: pd.DataFrame) -> str:
    return html_table(
        list(table.columns), [[str(v) for v in r] for r in table.itertuples(index=False)]
    )


def interval_lines(verdict: Any) -> list[str]:
    """Each difference the verdict computed, with both its intervals: "GELU minus ReLU:
    paired -0.008 (-0.012 to -0.004), n=2 pairs; unpaired -0.009 (-0.558 to +0.541), ..."."""
    return [comparison.both() for comparison in verdict.comparisons]


def verdicts_table(verdicts: Sequence[Any]) -> pd.DataFrame:
    """Claim, Source, Verdict, Reason, Intervals (paired and unpaired): one row per claim."""
    return pd.DataFrame(
        [
            {
                "Claim": v.claim.text,
                "Source": v.claim.source,
                "Verdict": v.verdict,
                "Reason": v.reason,
                "Intervals": " / ".join(interval_lines(v)),
            }
            for v in verdicts
        ],
        columns=["Claim", "Source", "Verdict", "Reason", "Intervals"],
    )


SENSITIVITY_NOTE = (
    "Learning-rate sensitivity (Wortsman et al. 2023): over the learning rates swept, the mean "
    "of min(loss, loss at init) minus the best loss of the sweep, per seed; 0 means every "
    "learning rate reached the best loss. Best loss: a seed's lowest final val loss over the "
    "sweep. Mean over seeds, 95% t interval."
)


def sensitivity_display(results: pd.DataFrame, swept: Sequence[str]) -> pd.DataFrame | None:
    """For a study that sweeps `lr` beside other fields: one row per setting of those fields
    (`qk_norm True, z_loss 0.0001` where there are several) with its learning-rate
    sensitivity and its best loss over the sweep, each with its interval; None for any
    other study."""
    from blockviz.core.studies.rules.sweep import sensitivity_table

    others = [f for f in swept if f != "lr" and f in results.columns]
    if "lr" not in swept or not others or results.empty:
        return None
    by = others[0] if len(others) == 1 else "setting"
    if len(others) > 1:
        results = results.assign(
            setting=[
                ", ".join(f"{name} {value}" for name, value in zip(others, row, strict=True))
                for row in results[others].itertuples(index=False)
            ]
        )
    table = sensitivity_table(results, "lr", by)

    def interval(low: pd.Series, high: pd.Series) -> list[str]:
        return [
            "" if _missing(lo) else f"{lo:.3f} to {hi:.3f}"
            for lo, hi in zip(low, high, strict=True)
        ]

    return pd.DataFrame(
        {
            by: table[by].astype(str),
            "LR sensitivity": [
                _loss(m, lo, hi)
                for m, lo, hi in zip(table["sensitivity"], table["low"], table["high"], strict=True)
            ],
            "95% interval": interval(table["low"], table["high"]),
            "best loss": [
                _loss(m, lo, hi)
                for m, lo, hi in zip(
                    table["best"], table["best_low"], table["best_high"], strict=True
                )
            ],
            "best loss, 95% interval": interval(table["best_low"], table["best_high"]),
            "seeds": table["seeds"].astype(int),
        }
    )


def scoring_note(results: pd.DataFrame) -> str | None:
    """A warning when finished runs were scored on their own seed's windows (runs recorded
    before the evaluation set): their spread then holds which text each seed drew."""
    if results.empty or "same_text" not in results.columns:
        return None
    finished = results[results["outcome"] != ""]
    old = int((~finished["same_text"].astype(bool)).sum())
    if old == 0:
        if "eval_windows" not in finished.columns:
            return None
        counts = sorted({int(n) for n in finished["eval_windows"].dropna()})
        if len(counts) < 2:
            return None
        sizes = and_list(f"{n:,}" for n in counts)
        return (
            f"The finished runs were scored on {sizes} evaluation windows "
            "(eval_iters × batch_size differ between variants): the larger evaluations "
            "include the smaller ones' text and more, so their val losses are not measured "
            "on quite the same text. Sweep eval_iters and batch_size together to keep it."
        )
    return (
        f"{old} of {len(finished)} finished runs were scored on validation windows drawn from "
        "their own training seed (recorded before the evaluation seed), so seeds differ in the "
        "text they were scored on as well as in training, and the spread and intervals are "
        "wider than the models'. Run the study again to score every run on one evaluation set."
    )
