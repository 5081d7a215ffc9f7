"""The "Gradients at init" page's measurement: `blockviz init-grads --json` in a subprocess.

The dashboard never imports torch, so the measurement runs as the CLI command in its own
process; its stderr progress lines ("progress 3/72 ...") drive a callback, its JSON lands in
a temporary file (not a pipe: a large result would block the child while we read stderr).
Results are kept per (config, options) for the life of the Streamlit server.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from blockviz.core import spec
from blockviz.core.config import RunConfig
from blockviz.launch.runner import PROJECT_DIR

Progress = Callable[[int, int, str], None]
_PROGRESS = re.compile(r"^progress (\d+)/(\d+) (.*)$")
_CACHE: OrderedDict[str, dict[str, Any]] = OrderedDict()
CACHE_SIZE = 16  # results held; a few hundred KB each at most


class InitGradsError(RuntimeError):
    """The measurement process failed; the message is its own last error line."""


def cache_key(
    run_config: RunConfig, depths: Sequence[int], inits: Sequence[str], n_seeds: int
) -> str:
    """What decides the result: model, data, batch size and the options, as one JSON string."""
    parts = run_config.to_dict()
    return json.dumps(
        {
            "model": parts["model"],
            "data": parts["data"],
            "batch_size": run_config.train.batch_size,
            "depths": sorted(depths),
            "inits": sorted(inits),
            "n_seeds": n_seeds,
        },
        sort_keys=True,
    )


def cached(key: str) -> dict[str, Any] | None:
    """A result measured before for this key, or None."""
    return _CACHE.get(key)


def command(
    config_path: str, depths: Sequence[int], inits: Sequence[str], n_seeds: int
) -> list[str]:
    """The CLI command the page runs."""
    return [
        sys.executable,
        "-m",
        "blockviz",
        "init-grads",
        "--config",
        config_path,
        "--depths",
        *map(str, sorted(depths)),
        "--inits",
        *sorted(inits),
        "--seeds",
        str(n_seeds),
        "--json",
    ]


def measure(
    run_config: RunConfig,
    depths: Sequence[int],
    inits: Sequence[str],
    n_seeds: int,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the CLI, report its progress, cache and return its JSON; InitGradsError if it fails."""
    key = cache_key(run_config, depths, inits, n_seeds)
    if key in _CACHE:
        return _CACHE[key]
    with tempfile.TemporaryDirectory(prefix="blockviz-init-grads-") as tmp:
        config_path, out_path = Path(tmp) / "config.json", Path(tmp) / "result.json"
        config_path.write_text(run_config.to_json(), encoding="utf-8")
        errors: list[str] = []
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                command(str(config_path), depths, inits, n_seeds),
                cwd=PROJECT_DIR,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            for line in proc.stderr:
                match = _PROGRESS.match(line.strip())
                if match and progress is not None:
                    progress(int(match[1]), int(match[2]), match[3])
                elif not match and line.strip():
                    errors.append(line.strip())
            proc.wait()
        if proc.returncode != 0:
            raise InitGradsError(errors[-1] if errors else f"exit status {proc.returncode}")
        result = json.loads(out_path.read_text(encoding="utf-8"))
    _CACHE[key] = result
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return result


PAPER_CLAIM = (
    "**The paper's claim** (Xiong et al. 2020, *On Layer Normalization in the Transformer "
    "Architecture*, Theorem 1; Xavier init, at initialization, under the paper's assumptions): "
    "the gradient of the last layer's FFN weight is bounded by O(d √(ln d)) in Post-LN and by "
    "O(d √(ln d / L)) in Pre-LN, so the Post-LN / Pre-LN ratio is expected to grow with the "
    "depth L. The charts below are this model's own numbers, which may or may not agree."
)


def _seeds(n: int) -> str:
    return "1 seed" if n == 1 else f"{n} seeds"


def _times(value: float) -> str:
    return f"{value:.2f}×"


def ratio_sentences(result: dict[str, Any]) -> list[str]:
    """One sentence per init, every number read from the result's summary and rows."""
    sentences = []
    for init in result["inits"]:
        rows = sorted((r for r in result["summary"] if r["init"] == init), key=lambda r: r["depth"])
        if not rows:
            continue
        ratios = [r["ratio"] for r in rows]
        steps = list(itertools.pairwise(ratios))
        shown = {f"{ratio:.2f}" for ratio in ratios}
        if len(rows) == 1:
            trend = ""
        elif len(shown) == 1:
            trend = f"; the ratio rounds to {shown.pop()}× at every depth"
        elif all(b > a for a, b in steps):
            trend = "; the ratio grows with every added depth"
        elif all(b < a for a, b in steps):
            trend = "; the ratio falls with every added depth"
        else:
            trend = "; the ratio does not move in one direction with depth"
        listed = ", ".join(f"{_times(r['ratio'])} at {r['depth']} layers" for r in rows)
        profile = _profile(result["rows"], init, rows[-1]["depth"])
        sentences.append(
            f"**{init}**: the last block's gradient, Post-LN / Pre-LN, is {listed} "
            f"(seed means, {_seeds(len(result['seeds']))}){trend}. {profile}"
        )
    return sentences


def _profile(rows: Sequence[dict[str, Any]], init: str, depth: int) -> str:
    """First-block / last-block ratio of each position at one depth (seed means)."""
    parts = []
    for position in ("post", "pre"):
        ends: dict[int, list[float]] = {0: [], depth - 1: []}
        for r in rows:
            variant = (r["init"], r["depth"], r["norm_position"])
            if variant == (init, depth, position) and r["layer"] in ends:
                ends[r["layer"]].append(r[spec.GRAD_NORM])
        first, last = (sum(v) / len(v) for v in (ends[0], ends[depth - 1]))
        parts.append(f"{position}-LN first / last = {first / last:.2f}")
    return f"Across blocks at {depth} layers: " + ", ".join(parts) + "."
