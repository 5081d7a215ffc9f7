"""The induction-head finding's calibration (issue 39): the runs its thresholds were chosen
on and the held-out runs they are judged on, each trained by `blockviz train` and read back
as the finding reads it, at every probe.

    .venv/bin/python benchmarks/induction_runs.py [--only NAME,...] [--threads 1]
        [--work /tmp/induction-runs] [--out benchmarks/results/induction-runs.json]

Every run is 2 blocks x 4 heads, d_model 128, attention only, batch 12, lr 1e-3 unless its
row says another (the default schedule: 100 warm-up steps, cosine to 1e-4), one thread. The
control text is made here from its own seed: lines of 5 to 30 random lowercase letters, the
same letters again, a newline, 1 MB. For each run the script records the finding at the end
and the step it named after every probe (a formation step must not move as the run goes on),
each head's largest prefix score with its standard error, the formed head's attention
entropy, and whether the finding said what the run did: formed heads where the model copies
in context (its repeat-loss gain at the end at least COPIES_GAIN), none where it does not.
docs/findings.md's "Induction heads" table is generated from the JSON
(`blockviz.views.induction_runs`, by `python -m blockviz.cli.docs`). Not a test: it trains
for about 30 minutes on one core (`--reread` reads the stored runs again, after a change of
the rule, without training).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_train import machine  # noqa: E402
from benchmarks.induction_probe import cpu_model  # noqa: E402
from blockviz.core import spec  # noqa: E402
from blockviz.core.findings import thresholds  # noqa: E402
from blockviz.core.findings.base import run_series  # noqa: E402
from blockviz.core.findings.induction import formation_threshold, induction_heads  # noqa: E402
from blockviz.core.induction import probe_rows  # noqa: E402
from blockviz.store import RunStore  # noqa: E402
from blockviz.views.run_findings import SCALARS, read_layers  # noqa: E402

CONTROL_SEED = 39  # the control text's own generator
CONTROL_CHARS = 1_000_000
# A run copies in context (what the finding should then report) when its end-of-run loss on
# the repeated batch's second repeat is this many nats under its loss on the first: e-fold
# better predictions of letters it has seen in the row (a uniform guess over 26 letters
# loses 3.26 nats).
COPIES_GAIN = 1.0
MODEL = ["--n_layer", "2", "--n_head", "4", "--d_model", "128", "--ffn", "false"]
TRAIN = ["--batch_size", "12", "--eval_interval", "250", "--eval_iters", "10"]
CONTROL = "control: repeated random letters (lines of 5–30 letters, the same again, a newline)"
SHAKESPEARE = "Tiny Shakespeare"


def planned(
    name: str,
    kind: str,
    text: str,
    ctx: int,
    probe: int,
    seed: int,
    lr: float = 1e-3,
    steps: int = 3000,
) -> dict[str, Any]:
    """One run of the calibration (3,000 steps unless said); a control is built to form
    induction heads ("expect": "forms"), Tiny Shakespeare not to."""
    expect = "forms" if text == CONTROL else "none"
    return {"name": name, "set": kind, "expect": expect, "text": text, "ctx": ctx,
            "steps": steps, "probe": probe, "seed": seed, "lr": lr}  # fmt: skip


# set "chosen": the runs the thresholds were set on; "held-out": the runs they are judged
# on (other seeds, another context, another text).
RUNS: list[dict[str, Any]] = [
    planned("control-ctx64-s1337", "chosen", CONTROL, 64, 25, 1337),
    planned("shakespeare-ctx128-s1337", "chosen", SHAKESPEARE, 128, 50, 1337),
    planned("control-ctx64-s7", "held-out", CONTROL, 64, 25, 7),
    planned("control-ctx64-s2", "held-out", CONTROL, 64, 25, 2),
    planned("control-ctx128-s1337", "held-out", CONTROL, 128, 25, 1337),
    planned("shakespeare-ctx64-s7", "held-out", SHAKESPEARE, 64, 50, 7),
    # Another learning rate: of the three control seeds at lr 1e-3 only the chosen one
    # learned to copy within 3,000 steps, which left the held-out set no run to hit.
    planned("control-ctx64-s3-lr3e-3", "held-out", CONTROL, 64, 25, 3, lr=3e-3),
    planned("control-ctx64-s5-lr3e-3", "held-out", CONTROL, 64, 25, 5, lr=3e-3),
    # Neither learned the letters at lr 3e-3; two more at 1e-3: seed 7 for twice as long,
    # and a fresh seed.
    planned("control-ctx64-s7-6k", "held-out", CONTROL, 64, 25, 7, steps=6000),
    planned("control-ctx64-s11", "held-out", CONTROL, 64, 25, 11),
]


def control_text(path: Path) -> Path:
    """Write the control text (CONTROL_CHARS characters) once; the same at every call."""
    if path.is_file():
        return path
    draws = np.random.default_rng(CONTROL_SEED)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lines, size = [], 0
    while size < CONTROL_CHARS:
        half = "".join(draws.choice(letters, int(draws.integers(5, 31))))
        lines.append(f"{half}{half}\n")
        size += len(lines[-1])
    path.write_text("".join(lines)[:CONTROL_CHARS], encoding="utf-8")
    return path


def train(run: dict[str, Any], dataset: str, db: Path, threads: int) -> float:
    """Train one run into its own store; the wall seconds it took."""
    command = [
        sys.executable, "-m", "blockviz", "train", "--store", str(db), "--threads", str(threads),
        "--no_progress", "--name", run["name"], "--dataset", dataset, *MODEL, *TRAIN,
        "--block_size", str(run["ctx"]), "--max_steps", str(run["steps"]),
        "--probe_interval", str(run["probe"]), "--sample_interval", str(run["steps"]),
        "--seed", str(run["seed"]), "--lr", str(run.get("lr", 1e-3)),
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - started


def read_back(db: Path, name: str) -> dict[str, Any]:
    """What the finding says of a stored run at its end and after each of its probes."""
    with RunStore(str(db)) as store:
        record = store.get_run(name)
        scalars = store.scalars(int(record.id), names=[*SCALARS, spec.PROBE_REPEAT_GAIN])
        layers = read_layers(store, int(record.id))
    series = run_series(record, scalars, layers)
    final = induction_heads(series)
    named = []  # (probe step, the step the finding named then, or None)
    probes = sorted(set(layers.loc[layers.stat == spec.PREFIX_SCORE, "step"]))
    for step in probes:
        seen = run_series(record, scalars[scalars.step <= step], layers[layers.step <= step])
        found = induction_heads(seen)
        named.append((int(step), found.step if found is not None else None))
    return {"final": final, "named": named, "series": series}


def head_summary(series: Any) -> list[dict[str, Any]]:
    """Each head's largest prefix score, its standard error and step, its entropy there."""
    scores = series.table("head", spec.PREFIX_SCORE)
    errors = series.table("head", spec.PREFIX_SCORE_SE)
    entropy = series.table("head", spec.ATTN_ENTROPY)
    copies = series.table("head", spec.COPY_SCORE)
    heads = []
    for column in scores.columns:
        values = scores[column].astype(float)
        at = int(values.idxmax())
        heads.append({
            "layer": int(column[0]), "head": int(column[1]), "largest": float(values.max()),
            "at": at, "se": float(errors.loc[at, column]),
            "entropy": float(entropy.loc[at, column]), "final": float(values.iloc[-1]),
            "final_se": float(errors[column].iloc[-1]),
            "final_copy": float(copies[column].iloc[-1]),
        })  # fmt: skip
    return heads


def losses(series: Any) -> dict[str, float | None]:
    """The mean of the last 50 logged train losses and the last val loss."""
    train_loss = series.scalar(spec.TRAIN_LOSS)["value"]
    val = series.scalar(spec.VAL_LOSS)["value"]
    gain = series.scalar(spec.PROBE_REPEAT_GAIN)["value"]
    return {
        "train_last50": float(train_loss.tail(50).mean()),
        "val": float(val.iloc[-1]) if not val.empty else None,
        "repeat_gain_max": float(gain.max()) if not gain.empty else None,
        "repeat_gain_end": float(gain.iloc[-1]) if not gain.empty else None,
    }


def outcome(named: list[tuple[int, int | None]], gain_end: float | None) -> dict[str, Any]:
    """Did the finding say what the run did, and did its step hold still. What it did is
    read from the loss, not the attention: the model copies in context when its loss on the
    repeated batch's second repeat is at least COPIES_GAIN nats under its loss on the first
    at the end (`probe/repeat_gain`)."""
    steps = [at for _, at in named]
    first = next((i for i, at in enumerate(steps) if at is not None), None)
    after = steps[first:] if first is not None else []
    formed_end = bool(steps) and steps[-1] is not None
    result = {
        "formed_at_end": formed_end,
        "named_steps": sorted({at for at in after if at is not None}),
        "probes_after_first_formation": len(after),
        "probes_saying_none_after_formation": sum(at is None for at in after),
    }
    copies = gain_end is not None and gain_end >= COPIES_GAIN
    result["copies"] = copies
    if copies:
        result["verdict"] = "hit" if formed_end else "miss"
    else:
        result["verdict"] = "false alarm" if first is not None else "correct: none"
    return result


def measure(
    run: dict[str, Any], work: Path, threads: int, before: dict[str, Any] | None
) -> dict[str, Any]:
    """Train one run and read it back: the row the results JSON keeps. With `before` (its
    row of an earlier call) the stored run is read again, not trained."""
    dataset = (
        str(control_text(work / "control-letters.txt")) if run["text"] == CONTROL else "shakespeare"
    )
    db = work / f"{run['name']}.db"
    if before is None:
        db.unlink(missing_ok=True)
        load = os.getloadavg()
        seconds = train(run, dataset, db, threads)
    else:
        load, seconds = before["load_avg_at_start"], before["wall_s"]
    read = read_back(db, run["name"])
    final = read["final"]
    row = {
        **run,
        "rows": probe_rows(run["ctx"]),
        "threshold": formation_threshold(run["ctx"]),
        "wall_s": round(seconds, 1),
        "load_avg_at_start": [round(value, 2) for value in load],
        "finding": {"title": final.title, "text": final.text, "step": final.step},
        "formed": None,
        **losses(read["series"]),
        "heads": head_summary(read["series"]),
        "named": read["named"],
        **outcome(read["named"], losses(read["series"])["repeat_gain_end"]),
    }
    if final.step is not None:
        evidence = final.evidence
        layer, head = evidence["layer"], evidence["head"]
        entropy = read["series"].table("head", spec.ATTN_ENTROPY)
        row["formed"] = {
            "layer": layer, "head": head, "since": final.step, "score": evidence["score"],
            "se": evidence["score_se"], "latest": evidence["latest"],
            "latest_se": evidence["latest_se"], "heads": evidence["heads"],
            "entropy": float(entropy.loc[final.step, (layer, str(head))]),
            "bends": evidence["bend"]["bends"], "ratio": evidence["bend"]["ratio"],
            "z": evidence["bend"]["z"],
        }  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated run names (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, help="cap every run's steps (to check the script)")
    parser.add_argument(
        "--reread",
        action="store_true",
        help="read the runs stored in --work again (after a change of the rule), no training",
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "induction-runs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/induction-runs.json")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    wanted = set(filter(None, args.only.split(",")))
    kept = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    rows = {row["name"]: row for row in kept.get("runs", [])}
    measured_on = {**machine(), "cpu_model": cpu_model(), "date": time.strftime("%Y-%m-%d")}
    if (args.reread or wanted) and "machine" in kept:
        measured_on = kept["machine"]  # the first runs were measured there, then
    # Every call that trained, in order (each row also keeps its own load and seconds).
    commands = list(kept.get("commands", []))
    if not args.reread:
        commands.append(" ".join(["benchmarks/induction_runs.py", *(argv or sys.argv[1:])]))
    for run in RUNS:
        if wanted and run["name"] not in wanted:
            continue
        if args.steps:
            run = {**run, "steps": min(run["steps"], args.steps)}
        before = rows.get(run["name"]) if args.reread else None
        rows[run["name"]] = measure(run, args.work, args.threads, before)
        row = rows[run["name"]]
        print(f"{run['name']}: {row['finding']['title']} ({row['verdict']}, {row['wall_s']} s)")
    if not (args.reread or wanted):
        measured_on["load_avg_at_end"] = os.getloadavg()
    result = {
        "commands": commands,
        "threads": kept.get("threads", args.threads) if args.reread else args.threads,
        "machine": measured_on,
        "thresholds": {
            name: getattr(thresholds, name)
            for name in (
                "PREFIX_THRESHOLD",
                "PREFIX_OVER_UNIFORM",
                "PREFIX_Z",
                "PREFIX_RELEASE",
                "PREFIX_REVOKE",
                "PERSIST",
                "ENTROPY_FLOOR",
            )
        },
        "runs": [rows[run["name"]] for run in RUNS if run["name"] in rows],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=_plain) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


def _plain(value: Any) -> Any:
    """numpy and pandas scalars as JSON numbers."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    raise TypeError(f"not JSON: {value!r}")


if __name__ == "__main__":
    raise SystemExit(main())
