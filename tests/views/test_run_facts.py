"""Run summaries: the facts of a divergence, its sentences, and a run's stored model config."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from blockviz.core import config as cfg
from blockviz.core.divergence import Divergence, render_divergence, summarize_divergence
from blockviz.store import RunRecord, RunStore
from blockviz.views import run_facts


def frame(rows: list[tuple[int, str, float]]) -> pd.DataFrame:
    """Scalars as RunStore.scalars returns them (run, name, step order)."""
    data = pd.DataFrame(rows, columns=["step", "name", "value"]).assign(run_id=1)
    return data.sort_values(["name", "step"], kind="stable", ignore_index=True)


DIVERGED = frame(
    [(step, "train/loss", 2.0 - step / 10) for step in range(10)]
    + [(10, "train/loss", math.inf), (10, "train/grad_norm", math.nan)]
    + [(step, "train/grad_norm", 1.0) for step in range(10)]
)


def test_the_facts_of_a_divergence() -> None:
    facts = summarize_divergence(DIVERGED, diverged_step=10, error="loss is inf at step 10")
    assert facts.step == 10
    assert facts.last_finite_loss == pytest.approx(1.1) and facts.last_finite_step == 9
    assert facts.nonfinite_step == 10
    names = [name for name, _ in facts.nonfinite]
    assert names == ["train/grad_norm", "train/loss"]
    values = dict(facts.nonfinite)
    assert math.isnan(values["train/grad_norm"]) and values["train/loss"] == math.inf
    assert facts.error == "loss is inf at step 10"


def test_without_a_stored_step_the_first_non_finite_step_is_where() -> None:
    facts = summarize_divergence(DIVERGED, diverged_step=None)
    assert facts.step == 10 and facts.error is None


def test_a_divergence_with_nothing_read_still_has_a_headline() -> None:
    facts = summarize_divergence(frame([]))
    assert facts == Divergence(None, None, None, None, (), None)
    assert render_divergence(facts) == "This run diverged."


def test_the_plain_sentences() -> None:
    scalars = frame([(1200, "train/loss", 2.3125), (1234, "train/loss", -math.inf)])
    facts = summarize_divergence(scalars, diverged_step=1234, error="loss is inf")
    assert render_divergence(facts) == (
        "This run diverged at step 1,234. The last finite training loss was 2.312 at step "
        "1,200. At step 1,234: train/loss = -inf. loss is inf"
    )


def test_markup_wraps_the_headline_names_and_the_users_text_only() -> None:
    from blockviz.dashboard import ui

    error = "![t](http://127.0.0.1:9/p.png) **boom**"
    scalars = frame([(9, "train/loss", 1.5), (10, "odd`name", math.nan)])
    text = render_divergence(
        summarize_divergence(scalars, diverged_step=10, error=error),
        bold=lambda s: f"**{s}**",
        code=ui.literal,
        text=ui.plain,
    )
    assert text.startswith("**This run diverged at step 10.** ")
    assert f"{ui.literal('odd`name')} = NaN." in text
    assert text.endswith(ui.plain(error))
    assert "![t]" not in text and "**boom**" not in text


def test_read_divergence_reads_the_last_steps_whole(tmp_path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        run_id = store.create_run("a", {}, status="diverged")
        rows = [(step, "train/loss", 3.0 - step / 1000) for step in range(1000)]
        store.log_scalars(run_id, [*rows, (1000, "train/loss", math.inf)])
        store.flush()
        store.update_run(run_id, diverged_step=1000, step=1000, error="loss is inf")
        facts = run_facts.read_divergence(store, store.get_run(run_id))
    assert facts.step == 1000 and facts.last_finite_step == 999
    assert facts.last_finite_loss == pytest.approx(3.0 - 0.999)
    assert facts.nonfinite == (("train/loss", math.inf),)


@pytest.mark.parametrize(
    ("stored", "n_layer"),
    [
        (cfg.replace(cfg.preset("tiny"), n_layer=3, attention=False).to_dict(), 3),
        (None, None),
        ("not a config", None),
        ({"train": {}}, None),  # no model section
        ({"model": {"n_layer": "three"}}, None),
        ({"model": {"n_layer": 0}}, None),
        ({"model": {"layers": 3}}, None),  # not a field
    ],
)
def test_stored_model_config_is_none_when_missing_or_damaged(
    stored: Any, n_layer: int | None
) -> None:
    model = run_facts.stored_model_config(RunRecord(id=1, name="r", config=stored))
    assert (model.n_layer if model else None) == n_layer
    if model is not None:
        assert model.attention is False


def test_recent_tokens_per_sec_is_the_median_of_the_last_finite_steps() -> None:
    steps = list(range(60))
    values = [1000.0] * 55 + [10.0, float("nan"), 3000.0, 3000.0, 3000.0]  # a slow probe step
    frame = pd.DataFrame({"step": steps, "name": "train/tokens_per_sec", "value": values})
    assert run_facts.recent_tokens_per_sec(frame) == 1000.0
    assert run_facts.recent_tokens_per_sec(frame, window=3) == 3000.0
    assert run_facts.recent_tokens_per_sec(frame.iloc[:0]) is None
