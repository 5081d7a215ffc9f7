"""docs/findings.md's induction-runs table (views/induction_runs.py), from results made up
here: the chosen runs first, each run's row, the held-out counts, text kept out of markup."""

from __future__ import annotations

import copy

from blockviz.views.induction_runs import table


def head(largest: float, se: float) -> dict:
    return {"layer": 1, "head": 2, "largest": largest, "at": 1500, "se": se, "entropy": 0.9,
            "final": largest / 2, "final_se": se, "final_copy": 0.99}  # fmt: skip


def row(name: str, kind: str, copies: bool, verdict: str, named: list[int]) -> dict:
    return {
        "name": name, "set": kind, "expect": "forms", "copies": copies,
        "repeat_gain_end": 2.0, "text": "control <b>", "ctx": 64,
        "seed": 7, "steps": 3000, "probe": 25, "rows": 64, "train_last50": 2.5, "val": 2.6,
        "repeat_gain_max": 2.1, "heads": [head(0.05, 0.01), head(0.2, 0.012)],
        "finding": {"title": "Induction heads formed at step 1,500", "text": "a | b", "step": 1500},
        "named_steps": named, "probes_after_first_formation": 60 if named else 0,
        "probes_saying_none_after_formation": 0, "verdict": verdict,
    }  # fmt: skip


RESULTS = {
    "commands": ["benchmarks/induction_runs.py", "benchmarks/induction_runs.py --only held-pos"],
    "machine": {"cpu_model": "Intel Xeon", "torch_threads": 1, "date": "2026-11-28"},
    "runs": [
        row("held-pos", "held-out", True, "hit", [1500]),
        row("chosen-pos", "chosen", True, "hit", [1525]),
        row("held-neg", "held-out", False, "correct: none", []),
        row("held-pos-2", "held-out", True, "miss", []),
    ],
}


def test_the_table_puts_the_chosen_runs_first_and_counts_the_held_out_ones():
    text = table(RESULTS, "benchmarks/results/x.json")
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(lines) == 1 + 4  # the header and a row per run
    assert lines[1].startswith("| chosen |")
    assert "0.2 ± 0.012 (block 1 head 2, step 1,500; 0.9 nats)" in lines[1]
    assert "1,525 at all 60 probes from the first" in lines[1]
    assert "none formed at any probe" in lines[3]
    assert "| yes (2 nats) |" in lines[1]
    assert "formed in **1 of 2** runs whose model copies in context" in text
    assert "a false alarm in **0 of 1** runs whose model does not" in text
    assert "moved or lapsed in 0 of 4 runs" in text
    assert (
        "(`benchmarks/induction_runs.py`; `benchmarks/induction_runs.py --only held-pos`;" in text
    )
    assert "control &lt;b&gt;" in text and "a \\| b" in text  # no markup, no broken cells


def test_a_step_that_lapsed_or_moved_is_counted_and_shown():
    results = copy.deepcopy(RESULTS)
    results["runs"][0]["named_steps"] = [1500, 2875]
    results["runs"][0]["probes_saying_none_after_formation"] = 3
    text = table(results, "x.json")
    assert "1,500, 2,875 at all 60 probes from the first; 3 said none" in text
    assert "moved or lapsed in 1 of 4 runs" in text
