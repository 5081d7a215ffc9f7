"""A study's results and verdicts as plain text and JSON (`study show`, `study run`)."""

from __future__ import annotations

from typing import Any

from blockviz.store import RunStore


def summary_json(store: RunStore, study_id: int) -> dict[str, Any]:
    runs = store.study_runs(study_id)
    return {"study": study_id, "runs": len(runs)}


def summary_text(store: RunStore, study_id: int) -> str:
    runs = store.study_runs(study_id)
    lines = []
    for row in runs.itertuples():
        lines.append(f"{row.variant}  seed {row.seed}  {row.status}  {row.final.get('val_loss')}")
    return "\n".join(lines)
