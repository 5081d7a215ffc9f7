"""A study's results and verdicts as plain text and JSON (`study show`, `study run`)."""

from __future__ import annotations

import math
from typing import Any

from blockviz.core.studies.define import StudyDef, plan_from_spec
from blockviz.core.studies.outcomes import results_frame
from blockviz.core.studies.rules.base import Verdict
from blockviz.core.studies.summary import summarize
from blockviz.core.studies.verdicts import judge
from blockviz.store import RunStore
from blockviz.views.studies import table as study_table


def _verdicts(plan: StudyDef, results: Any) -> list[Verdict]:
    return [judge(claim, results, plan) for claim in plan.claims]


def json_safe(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None, numpy scalars plain numbers."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summary_json(store: RunStore, study_id: int) -> dict[str, Any]:
    """What `study show --json` prints: the study, its per-variant table and its verdicts."""
    study = store.get_study(study_id)
    plan = plan_from_spec(study.spec)
    results = results_frame(store.study_runs(study_id), plan)
    summary = summarize(results)
    return {
        "id": int(study.id),
        "name": study.name,
        "key": plan.key,
        "size": plan.size,
        "status": study.status,
        "question": plan.question,
        "seeds": list(plan.seeds),
        "scoring_note": study_table.scoring_note(results),
        "variants": [
            {key: json_safe(value) for key, value in row.items()}
            for row in summary.to_dict(orient="records")
        ],
        "sensitivity": (
            []
            if (table := study_table.sensitivity_display(results, plan.swept)) is None
            else table.to_dict(orient="records")
        ),
        "claims": [
            {
                "claim": v.claim.text,
                "source": v.claim.source,
                "verdict": v.verdict,
                "reason": v.reason,
                "intervals": study_table.interval_lines(v),
                "numbers": {k: json_safe(x) for k, x in dict(v.numbers).items()},
            }
            for v in _verdicts(plan, results)
        ],
    }


def summary_text(store: RunStore, study_id: int) -> str:
    """The results table (Markdown) and, per claim, its verdict, reason and intervals."""
    study = store.get_study(study_id)
    plan = plan_from_spec(study.spec)
    if not plan.trains:
        folder = store.study_dir(study_id)
        return f"gradients at initialisation: {folder / 'init_grads.json'}"
    results = results_frame(store.study_runs(study_id), plan)
    table = study_table.results_table(summarize(results), plan.baseline)
    lines = [study_table.table_markdown(table)]
    note = study_table.scoring_note(results)
    if note:
        lines += [f"note: {note}", ""]
    sensitivity = study_table.sensitivity_display(results, plan.swept)
    if sensitivity is not None:
        lines += [study_table.table_markdown(sensitivity), study_table.SENSITIVITY_NOTE, ""]
    for verdict in _verdicts(plan, results):
        lines.append(f"[{verdict.verdict}] {verdict.claim.text} ({verdict.claim.source})")
        lines.append(f"    {verdict.reason}")
        lines += [f"    intervals: {line}" for line in study_table.interval_lines(verdict)]
    return "\n".join(lines)
