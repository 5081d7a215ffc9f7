"""The plateau rule on constructed series: a loss that went below the unigram entropy and
stopped just below it (issue 39, defect 7), against the runs it must leave alone.

The audit's two runs, moved onto the helpers' unigram entropy (3.0 here, 3.31 there): the
train loss's running median rose 3.08 → 3.19 after step 100 (0.12 below the unigram
entropy at the end) with val 3.10 → 3.21; and val flat 3.12 → 3.17 from step 125. Both read
"Trains" before the rule existed.
"""

from __future__ import annotations

import pytest

from blockviz.core import findings as fd
from blockviz.core.findings.thresholds import PLATEAU_BELOW, PLATEAU_FALL, PLATEAU_STEPS
from blockviz.core.findings.training import headline
from tests.helpers import UNIGRAM, scalars, series

AUDIT_H1 = 3.31


def _shaped(points: dict[int, float], end: int, noise: float = 0.03) -> dict[int, float]:
    """A logged loss through `points` (step -> the audit's value), linear between them,
    moved from the audit's unigram entropy onto UNIGRAM, with alternating noise."""
    steps = sorted(points)
    loss = {}
    for step in range(end + 1):
        right = next(s for s in steps if s >= step)
        left = max(s for s in steps if s <= step)
        share = 0.0 if right == left else (step - left) / (right - left)
        level = points[left] + share * (points[right] - points[left])
        loss[step] = level - AUDIT_H1 + UNIGRAM + (noise if step % 2 else -noise)
    return loss


def _run(train: dict[int, float], val: dict[int, float]):
    return series(scalars(**{"train/loss": train, "val/loss": val}))


# The audit's first run: down to 3.08 by step 100, then up to 3.19 by step 300.
RISING = _shaped({0: 4.2, 60: 3.08, 100: 3.08, 300: 3.19}, 300)
RISING_VAL = {
    s: v for s, v in _shaped({0: 4.2, 100: 3.10, 300: 3.21}, 300, 0).items() if s % 25 == 0
}
# The second: flat 3.12 → 3.17 from step 125.
FLAT = _shaped({0: 4.2, 50: 3.12, 350: 3.16}, 350)
FLAT_VAL = {
    s: v
    for s, v in _shaped({0: 4.2, 50: 3.16, 125: 3.12, 350: 3.17}, 350, 0).items()
    if s % 25 == 0
}


@pytest.mark.parametrize(("train", "val"), [(RISING, RISING_VAL), (FLAT, FLAT_VAL)])
def test_a_loss_stopped_just_below_the_unigram_entropy_is_a_plateau_not_trains(train, val):
    run = _run(train, val)
    found = fd.evaluate(run)
    (finding,) = [f for f in found if f.rule == "plateau"]
    assert finding.severity == "warning"
    assert {f.rule for f in found} == {"plateau"}  # the train loss rose too: not overfitting
    assert finding.title.startswith("Stopped improving just below the unigram entropy since step")
    assert 50 <= finding.evidence["since"] <= 150
    assert "Val loss: lowest" in finding.text
    top = headline(run, found)
    assert top.rule == "plateau" and top.title != "Trains"
    assert finding.suggestion.changes == {"lr": 3.3e-4}


def test_a_loss_still_falling_a_little_faster_than_the_bound_is_left_alone():
    fall = (PLATEAU_FALL + 0.01) * 3  # per 100 steps, over 300 steps
    train = _shaped({0: 4.2, 100: 3.15, 400: 3.15 - fall}, 400, noise=0.0)
    assert "plateau" not in {f.rule for f in fd.evaluate(_run(train, {}))}
    slower = _shaped({0: 4.2, 100: 3.15, 400: 3.15 - (PLATEAU_FALL - 0.01) * 3}, 400, noise=0.0)
    assert "plateau" in {f.rule for f in fd.evaluate(_run(slower, {}))}


def test_a_loss_flat_far_below_the_unigram_entropy_is_left_alone():
    end = AUDIT_H1 - PLATEAU_BELOW - 0.05
    train = _shaped({0: 4.2, 100: end, 400: end}, 400)
    assert "plateau" not in {f.rule for f in fd.evaluate(_run(train, {}))}
    inside = AUDIT_H1 - PLATEAU_BELOW + 0.05
    train = _shaped({0: 4.2, 100: inside, 400: inside}, 400)
    assert "plateau" in {f.rule for f in fd.evaluate(_run(train, {}))}


def test_an_overfitting_run_is_overfitting_not_a_plateau():
    train = _shaped({0: 4.2, 100: 3.0, 400: 2.9}, 400)
    val = {100: UNIGRAM - 0.25, 200: UNIGRAM - 0.3, 300: UNIGRAM - 0.2, 400: UNIGRAM - 0.1}
    rules = {f.rule for f in fd.evaluate(_run(train, val))}
    assert "overfitting" in rules and "plateau" not in rules


def test_a_loss_that_never_went_below_is_a_stall_and_a_short_run_cannot_show_one():
    stuck = _shaped({0: 4.2, 50: AUDIT_H1, 400: AUDIT_H1}, 400)
    rules = {f.rule for f in fd.evaluate(_run(stuck, {}))}
    assert "stalled" in rules and "plateau" not in rules
    end = PLATEAU_STEPS - 2
    short = fd.evaluate(_run(_shaped({0: 4.2, 100: 3.08, end: 3.08}, end), {}))
    (healthy,) = [f for f in short if f.rule == "healthy"]
    assert "a plateau below the unigram entropy" in healthy.text
