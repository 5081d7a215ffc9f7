"""Live's Attention tab on the induction scores: each on its whole range, never a log axis,
with a caption saying what it measures."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core import config as cfg
from blockviz.core import spec
from blockviz.core.findings.induction import formation_threshold
from blockviz.core.induction import repeat_half, uniform_prefix_score
from blockviz.store import RunStore
from tests import fakes
from tests.helpers import shown

PAGES = Path(__file__).resolve().parents[2] / "pages"


def y_scales(node: Any, title: str) -> list[dict]:
    """The scale of every y encoding titled `title` anywhere in a Vega-Lite spec."""
    found = []
    if isinstance(node, dict):
        y = node.get("y")
        if isinstance(y, dict) and y.get("title") == title:
            found.append(y.get("scale", {}))
        for value in node.values():
            found += y_scales(value, title)
    elif isinstance(node, list):
        for value in node:
            found += y_scales(value, title)
    return found


@pytest.mark.parametrize(
    ("stat", "domain", "words"),
    [
        (spec.PREFIX_SCORE, [0.0, 1.0], "standard errors is at or above"),
        (spec.COPY_SCORE, [-1.0, 1.0], "W_U·W_O·W_V·W_E"),
        (spec.ATTN_LOGIT_MAX_ABS, None, None),
    ],
)
def test_the_attention_tab_draws_each_head_statistic_on_its_own_axis(stat, domain, words):
    with RunStore(os.environ["BLOCKVIZ_STORE"]) as store:
        (run_id,) = fakes.populate(store, n_runs=1, n_steps=60, n_layer=2, n_head=2)
        config = cfg.RunConfig.from_dict(store.get_run(run_id).config)
        heads = store.layer_stats(run_id, kind="head", stat=stat)
    assert len(set(zip(heads.layer, heads.component, strict=True))) == 4
    at = AppTest.from_file(str(PAGES / "live.py"), default_timeout=60)
    at.session_state["run_id"] = run_id
    at.session_state["live.tab"] = "Attention"
    at.session_state["live.attn.stat"] = stat
    at.run()
    assert not at.exception
    specs = [json.loads(element.proto.spec) for element in at.get("vega_lite_chart")]
    (scale,) = [s for one in specs for s in y_scales(one, spec.stat_label(stat))]
    captions = [shown(caption.value) for caption in at.caption]
    if domain is None:  # the logits keep their log axis, and no induction caption
        assert scale.get("type") == "log"
        assert not any("Prefix-matching" in c or "Copying score" in c for c in captions)
        return
    assert scale.get("domain") == domain and scale.get("type") != "log"
    assert any(words in caption for caption in captions)
    if stat == spec.PREFIX_SCORE:
        baseline = uniform_prefix_score(repeat_half(config.model.block_size))
        assert any(f"Attending uniformly scores {baseline:.3f}" in c for c in captions)
        threshold = formation_threshold(config.model.block_size)
        assert any(f"is at or above {threshold:.3g} at 2 probes in a row" in c for c in captions)
