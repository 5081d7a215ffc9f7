"""Sentences about the gradient-by-layer chart, computed from the runs drawn on it.

Compare once printed a fixed sentence from the literature over its measured chart, and
for every init blockviz offered the chart showed otherwise. So nothing here is written
in advance: each sentence is read off the numbers of the runs on screen, names the step
it describes, and is left out when the numbers needed for it are missing or not finite.
The sentences are plain text; a Markdown caller escapes them (run names are user text).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from blockviz.core import spec

# A profile across blocks is "level" when first block / last block, as shown (two
# decimals), lies within LEVEL_RATIO either way (0.83 to 1.20): the word never disagrees
# with the number beside it. Otherwise it rises or falls towards the output. README
# ("Screenshots", Compare) documents the value.
LEVEL_RATIO = 1.2
# Two runs' last-block gradients within this factor read "about the same".
SAME_RATIO = 1.05

NORM_WORDS = {"pre": "Pre-LN", "post": "Post-LN", "none": "no norms"}
# What "gradient" means for each component the chart can show (block: the whole layer).
COMPONENT_WORDS = {
    "block": "gradient",
    "weights": "weight-matrix gradient",
    "attn": "attention gradient",
    "ffn": "FFN gradient",
    "norm": "norm-gain gradient",
}


@dataclass(frozen=True)
class RunShape:
    """What a sentence needs of a run besides its numbers: its name and its blocks."""

    name: str
    n_layer: int
    norm_position: str | None = None


def _when(step: int) -> str:
    return "At initialization (step 0)" if step == 0 else f"At step {step:,}"


def _num(value: float) -> str:
    return f"{value:.3g}"


def _ratio(ratio: float) -> str:
    """Two decimals, or two significant digits where two decimals would read 0.00."""
    return f"{ratio:.2f}" if 0.01 <= ratio < 100 else f"{ratio:.2g}"


def _times(ratio: float) -> str:
    return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:,.0f}×"


def _label(shape: RunShape) -> str:
    """The run's name with its norm position and depth, e.g. 'b (Post-LN, 6 blocks)'."""
    blocks = "1 block" if shape.n_layer == 1 else f"{shape.n_layer} blocks"
    norm = NORM_WORDS.get(shape.norm_position or "")
    return f"{shape.name} ({norm}, {blocks})" if norm else f"{shape.name} ({blocks})"


def block_values(frame: pd.DataFrame, run_id: int, n_layer: int, step: int) -> dict[int, float]:
    """Block index -> gradient norm of one run at exactly `step`; finite, positive values only.

    Layer -1 (embeddings) and layer n_layer (final norm, head) are not blocks.
    """
    rows = frame[(frame["run_id"] == run_id) & (frame["step"] == step)]
    rows = rows[(rows["layer"] >= 0) & (rows["layer"] < n_layer)]
    values = pd.to_numeric(rows["value"], errors="coerce")
    means = values.groupby(rows["layer"]).mean()
    return {int(layer): float(v) for layer, v in means.items() if math.isfinite(v) and v > 0}


def profile_word(first: float, last: float) -> str:
    """'level', 'rising towards the output' or 'falling towards the output' (LEVEL_RATIO)."""
    ratio = round(first / last, 2)
    if round(1 / LEVEL_RATIO, 2) <= ratio <= LEVEL_RATIO:
        return "level"
    return "rising towards the output" if ratio < 1 else "falling towards the output"


def _profile_sentence(shape: RunShape, values: dict[int, float], step: int, what: str) -> str:
    """How the run's gradient changes from its first block to its last; '' without both."""
    if shape.n_layer == 1:
        return f"{_when(step)}, {_label(shape)} has one block, so no profile across blocks."
    first, last = values.get(0), values.get(shape.n_layer - 1)
    if first is None or last is None:
        return ""
    spread = ""
    if len(values) == shape.n_layer:
        spread = f"; every block between {_num(min(values.values()))} and "
        spread += _num(max(values.values()))
    return (
        f"{_when(step)}, {_label(shape)}: from the first block to the last the {what} is "
        f"{profile_word(first, last)} (first / last = {_ratio(first / last)}{spread})."
    )


def _pair_sentence(a: str, a_last: float, b: str, b_last: float, step: int, what: str) -> str:
    """How two runs' last-block gradients compare, the larger named first."""
    if a_last < b_last:
        a, a_last, b, b_last = b, b_last, a, a_last
    ratio = a_last / b_last
    if ratio <= SAME_RATIO:
        return (
            f"{_when(step)}, the last block's {what} is about the same in {a} and {b} "
            f"({_num(a_last)} vs {_num(b_last)})."
        )
    return (
        f"{_when(step)}, the last block's {what} is {_times(ratio)} larger in {a} than in "
        f"{b} ({_num(a_last)} vs {_num(b_last)})."
    )


def grad_by_layer_sentences(
    frame: pd.DataFrame, runs: Mapping[int, RunShape], step: int, component: str = "block"
) -> list[str]:
    """Plain sentences about the gradient norm by layer at `step`, from the numbers only.

    `frame` holds layer_stats rows (run_id, step, layer, value; grad_norm of `component`
    if those columns are present); `runs` maps each run id on screen to its shape, in the
    order the runs were picked (runs without a known shape get no sentence). Per run: its
    profile from the first block to the last; then each other run's last block against
    the first run's that has one.
    """
    what = COMPONENT_WORDS.get(component)
    if what is None or frame.empty:
        return []  # embed / head have no blocks; nothing drawn, nothing said
    if "component" in frame.columns:
        frame = frame[frame["component"] == component]
    if "stat" in frame.columns:
        frame = frame[frame["stat"] == spec.GRAD_NORM]
    sentences: list[str] = []
    lasts: list[tuple[str, float]] = []
    for run_id, shape in runs.items():
        if shape.n_layer < 1:
            continue
        values = block_values(frame, run_id, shape.n_layer, step)
        if not values:
            continue  # not probed at this step, or nothing finite: nothing to say
        sentence = _profile_sentence(shape, values, step, what)
        if sentence:
            sentences.append(sentence)
        if shape.n_layer - 1 in values:
            lasts.append((shape.name, values[shape.n_layer - 1]))
    if len(lasts) > 1:
        (base, base_last), others = lasts[0], lasts[1:]
        sentences += [_pair_sentence(n, v, base, base_last, step, what) for n, v in others]
    return sentences


# The paper's claim, stated as a claim with its conditions; docs/config-guide.md ("Model")
# has what the runs of this code show under each init.
PAPER_CLAIM = (
    "The paper's claim, not a measurement of the runs above: Xiong et al. 2020 (On Layer "
    "Normalization in the Transformer Architecture, Theorem 1), for Xavier init in their "
    "Transformer, bound the gradient of the last layer's FFN output weight at "
    "initialization by O(d·√(ln d)) in Post-LN, whatever the depth L, and by "
    "O(d·√(ln d / L)) in Pre-LN, shrinking as √(1/L); they argue that this is why Post-LN "
    "needs a learning-rate warm-up. See docs/config-guide.md (Model) for what this model shows."
)
