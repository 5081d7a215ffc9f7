"""Every suggestion says what runs of this code showed of it (issue 39, defect 8).

`EVIDENCE` in core/findings/suggestions.py must say what benchmarks/findings_calibration.py's
remedy runs measured (its committed results, which docs/findings.md's remedies table is
generated from); a suggestion not among them says "untested here", in the words the
findings panel, `show` and the report render.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from blockviz.core import findings as fd
from blockviz.core.findings import suggestions as sg
from blockviz.core.findings.thresholds import LOG_Z_MAX, OUTPUT_LOGIT_MAX
from blockviz.views.run_findings import suggestion_text
from tests.helpers import flat_loss, scalars, series

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/findings-calibration.json"


def results() -> dict:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def test_the_evidence_table_says_what_the_remedy_runs_measured():
    """Each (rule, remedy) a rule can suggest that a remedy run tried on a held-out run
    showing the rule's problem carries what those runs did; no other pair claims any."""
    rows = [row for row in results()["remedies"] if row["fired_before"]]
    offered = {(rule, remedy) for rule, remedies in sg.SUGGESTS.items() for remedy in remedies}
    tried = Counter((row["rule"], row["remedy"]) for row in rows)
    helped = Counter((row["rule"], row["remedy"]) for row in rows if row["helped"])
    expected = {
        pair: sg.measured(helped[pair], count) for pair, count in tried.items() if pair in offered
    }
    assert expected == sg.EVIDENCE


def test_every_suggestion_the_held_out_runs_got_is_one_the_table_lists():
    for run in results()["runs"].values():
        for rule, remedy in run["suggested"].items():
            assert remedy in sg.SUGGESTS[rule], (rule, remedy)


def test_measured_words_how_many_runs_helped():
    assert sg.measured(1, 1) == sg.HELPED and sg.measured(0, 1) == sg.NOT_HELPED
    assert sg.measured(2, 5) == "it helped in 2 of 5 runs here"
    assert sg.measured(3, 3) == "it helped in 3 runs here"


def blow_up(**config: object):
    """Output logits past both bounds at two probes in a row."""
    steps = (0, 10, 20)
    return series(
        scalars(
            **{
                "train/loss": flat_loss(21),
                "probe/logit_max_abs": dict.fromkeys(steps, 2 * OUTPUT_LOGIT_MAX),
                "probe/log_z": dict.fromkeys(steps, 2 * LOG_Z_MAX),
            }
        ),
        **config,
    )


def logits_tip(run):
    (finding,) = [f for f in fd.evaluate(run) if f.rule == "output_logit_growth"]
    return finding.suggestion


def test_a_blow_up_without_norms_is_not_told_to_add_the_z_loss_that_did_not_stop_one():
    """Issue 39, defect 8: the z-loss was suggested for a blow-up like the one where it did
    not help (no norms, no clipping); Pre-LN, which stopped it here, comes first."""
    tip = logits_tip(blow_up(grad_clip=0.0, norm_position="none"))
    assert tip.remedy == "pre_ln" and tip.changes == {"norm_position": "pre"}
    said = sg.EVIDENCE.get(("output_logit_growth", "pre_ln"), sg.UNTESTED)
    assert tip.source == f"Xiong et al. 2020; {said}"
    # In a Pre-LN run, the z-loss: labelled with what runs here showed of it.
    tip = logits_tip(blow_up())
    assert tip.remedy == "z_loss"
    said = sg.EVIDENCE.get(("output_logit_growth", "z_loss"), sg.UNTESTED)
    assert tip.source == f"Chowdhery et al. 2022; Wortsman et al. 2023; {said}"


def test_every_suggestion_is_labelled_as_the_ui_renders_it():
    tip = logits_tip(blow_up(z_loss=1e-4))
    assert tip.remedy == "softcap"
    assert ("output_logit_growth", "softcap") not in sg.EVIDENCE
    assert suggestion_text(tip) == (
        "Cap the output logits at 30 (logit_softcap). (Gemma Team 2024; untested here)"
    )
