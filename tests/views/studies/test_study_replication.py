"""`study show` and `study show --json` on two constructed studies of one definition:
each seed set's verdict, the replication state, the seeds needed and the re-run command."""

from __future__ import annotations

import os

from blockviz.store import RunStore
from blockviz.views.studies import text as study_text
from tests.helpers import fake_study


def test_show_names_both_seed_sets_and_says_what_the_second_set_changes() -> None:
    # fake_study's losses repeat every 3 runs in grid order, so GELU minus ReLU is +0.02
    # and −0.01 on both sets: mean +0.005, sd 0.0212, a t(1) interval far wider than the
    # 0.02 margin, so inconclusive on both. Seeds needed: ((1.959964 + 0.841621) ·
    # 0.0212132 / |0.005 − 0.02|)² = 3.96198² = 15.70 → 16, fresh after seed 4: 5-20.
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        first = fake_study(store, seeds="1-2")
        second = fake_study(store, seeds="3-4")
        overlapping = fake_study(store, seeds="2-3")
        shown = study_text.summary_text(store, first)
        data = study_text.summary_json(store, first)
    assert (
        f"seed sets of this definition: seeds 1–2 (study {first}, this one); seeds 3–4 "
        f"(study {second}); seeds 2–3 (study {overlapping})"
    ) in shown
    assert (
        f"seeds 1–2 (study {first}): inconclusive; seeds 3–4 (study {second}): inconclusive → "
        "not replicated: inconclusive on every set: no verdict to replicate"
    ) in shown
    assert f"not a replication: seeds 2–3 (study {overlapping}) shares seed(s) 2 with" in shown
    assert "seeds needed: 16 per variant for the 95% interval of GELU minus ReLU" in shown
    assert "study run activation --size quick --seeds 5-20" in shown
    (claim,) = data["claims"]
    assert claim["replication"]["state"] == "not replicated"
    assert [(s["study"], s["seeds"]) for s in claim["replication"]["sets"]] == [
        (first, [1, 2]),
        (second, [3, 4]),
    ]
    assert claim["replication"]["overlapping"] == [{"study": overlapping, "seeds": [2, 3]}]
    assert claim["seeds_needed"]["n"] == 16 and not claim["seeds_needed"]["capped"]
    assert claim["seeds_needed"]["command"].endswith("--seeds 5-20")
    assert [s["study"] for s in data["seed_sets"]] == [first, second, overlapping]
