"""A study's results and verdicts as plain text and JSON (`study show`, `study run`)."""

from __future__ import annotations

import math
from typing import Any

from blockviz.core.studies.define import plan_from_spec
from blockviz.core.studies.summary import summarize
from blockviz.store import RunStore
from blockviz.views.studies import replication
from blockviz.views.studies import table as study_table


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
    sets = replication.seed_sets(store, study_id)
    plan, results = sets.plan, sets.results
    summary = summarize(results)
    return {
        "id": int(study.id),
        "name": study.name,
        "key": plan.key,
        "size": plan.size,
        "status": study.status,
        "question": plan.question,
        "seeds": list(plan.seeds),
        "seed_sets": [
            {"study": s.study_id, "seeds": list(s.seeds), "unfinished_runs": s.unfinished}
            for s in (sets.own, *sets.others)
        ],
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
                "claim": c.verdict.claim.text,
                "source": c.verdict.claim.source,
                "verdict": c.verdict.verdict,
                "reason": c.verdict.reason,
                "intervals": study_table.interval_lines(c.verdict),
                "numbers": {k: json_safe(x) for k, x in dict(c.verdict.numbers).items()},
                **replication.claim_json(c),
            }
            for c in replication.claims(store, sets)
        ],
    }


def summary_text(store: RunStore, study_id: int) -> str:
    """The results table (Markdown) and, per claim, its verdict, reason and intervals."""
    study = store.get_study(study_id)
    plan = plan_from_spec(study.spec)
    if not plan.trains:
        folder = store.study_dir(study_id)
        return f"gradients at initialisation: {folder / 'init_grads.json'}"
    sets = replication.seed_sets(store, study_id)
    results = sets.results
    table = study_table.results_table(summarize(results), plan.baseline)
    lines = [study_table.table_markdown(table)]
    note = study_table.scoring_note(results)
    if note:
        lines += [f"note: {note}", ""]
    sensitivity = study_table.sensitivity_display(results, plan.swept)
    if sensitivity is not None:
        lines += [study_table.table_markdown(sensitivity), study_table.SENSITIVITY_NOTE, ""]
    lines.append(replication.sets_line(sets))
    for claim in replication.claims(store, sets):
        verdict = claim.verdict
        lines.append(f"[{verdict.verdict}] {verdict.claim.text} ({verdict.claim.source})")
        lines.append(f"    {verdict.reason}")
        lines += [f"    intervals: {line}" for line in study_table.interval_lines(verdict)]
        lines += [f"    {line}" for line in replication.replication_lines(claim)]
        lines += [f"    {line}" for line in replication.needed_lines(claim)]
    return "\n".join(lines)
