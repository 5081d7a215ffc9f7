"""benchmarks/gpu_check.py, the device check of issue 34: end to end at toy size on this CPU,
and its failure handling (a part that fails is an error row, the others run, exit 1)."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@functools.cache
def load_check():
    """The script as a module (benchmarks/ is no package), with its benchmark neighbours."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def corpus(path: Path) -> Path:
    """A small text of English-like words (Tiny Shakespeare is not in the repo)."""
    rng = random.Random(0)
    words = ["the", "king", "of", "love", "and", "what", "shall", "thou", "my", "lord"]
    lines = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(800)]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def numbers(row: dict) -> list[float]:
    return [v for v in row.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]


def test_largest_difference_counts_shared_keys_and_a_lone_nan_as_infinite() -> None:
    check = load_check()
    assert check.largest_difference({1: 1.0, 2: 2.0, 3: 9.0}, {1: 1.5, 2: 2.0}) == (0.5, 2)
    assert check.largest_difference({1: math.nan}, {1: math.nan}) == (0.0, 1)
    assert check.largest_difference({1: math.nan}, {1: 1.0}) == (math.inf, 1)
    assert check.largest_difference({1: 1.0}, {2: 1.0}) == (None, 0)


def test_a_failing_part_is_an_error_row_and_the_next_part_runs(tmp_path: Path) -> None:
    check = load_check()
    reported = []
    parts = check.run_parts(
        check.Check("cpu", tmp_path),
        check.SIZES["toy"],
        tmp_path / "missing.txt",
        reported.append,
        ("equality", "recipe"),
    )
    assert list(parts) == ["equality", "recipe"]
    assert not parts["equality"]["ok"] and not parts["recipe"]["ok"]
    assert "the solo run failed" in parts["equality"]["rows"][0]["error"]
    assert "missing.txt" in parts["recipe"]["rows"][0]["error"]
    assert len(reported) == 2  # the JSON is rewritten after each part
    assert "ERROR: CheckError: no tinyshakespeare.txt" in check.table(parts["recipe"]["rows"])


def test_a_run_past_the_budget_is_not_started(tmp_path: Path) -> None:
    check = load_check()
    spent = check.Check("cpu", tmp_path, deadline=0.0)  # monotonic time 0: long past
    parts = check.run_parts(spent, check.SIZES["toy"], None, lambda parts: None, ("fork",))
    assert "not started, 0 s of --budget_s left" in parts["fork"]["rows"][0]["error"]
    assert list(tmp_path.iterdir()) == []  # no process, no store


@pytest.mark.slow
def test_toy_check_on_the_cpu_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(SCRIPT), "--size", "toy", "--accelerator", "cpu"]
    command += ["--data", str(corpus(tmp_path / "text.txt")), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for part in ("replicas", "equality", "fork", "recipe"):
        assert f"## {part} (" in done.stdout
    assert "torch " in done.stdout and "lightning " in done.stdout
    assert "load average" in done.stdout

    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["failed"] == []
    parts = result["parts"]
    assert [row["case"] for row in parts["replicas"]["rows"]] == ["solo", "K=1", "K=2", "K=4"]
    assert len(parts["equality"]["rows"]) == 3
    assert [row["case"] for row in parts["recipe"]["rows"]] == ["compiled", "eager"]
    for name, part in parts.items():
        for row in part["rows"]:
            assert "error" not in row, (name, row)
            assert all(math.isfinite(v) for v in numbers(row)), (name, row)
    for row in parts["replicas"]["rows"]:
        assert row["tokens_per_s_total"] > 0 and row["step_ms"] > 0 and row["peak_mib"] > 0
        assert row["runs"] == row["k"] and row["memory"] == "rss"
    assert parts["replicas"]["rows"][0]["x_solo"] == 1
    for row in parts["equality"]["rows"]:
        assert row["steps_compared"] == 20
        assert row["max_abs_train_loss_diff"] < 1e-3  # float32 rounding on a CPU
    compiled, eager = parts["recipe"]["rows"]
    assert eager["steps"] == 30 and eager["best_val_loss"] > 0
    assert "skipped" in compiled
    (fork,) = parts["fork"]["rows"]
    assert fork["values_compared"] > 0 and fork["max_abs_diff"] == 0
