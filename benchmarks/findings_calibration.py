"""The findings rules judged on held-out runs, and what their suggestions did here.

    .venv/bin/python benchmarks/findings_calibration.py [--store PATH] [--out JSON]

Trains (one process, one thread, CPU) every run below that the store does not hold yet,
evaluates the findings of each, and writes the results JSON that docs/findings.md's
calibration and remedies tables are generated from (`python -m blockviz.cli.docs`).

None of these runs is one the thresholds were set on: those are tests/finding_runs.py's
(pydocs, seed 1337) and BENCHMARKS.md's "runs behind the thresholds" (pydocs, baby-cpu).
These use other datasets (Tiny Shakespeare, pycode, texts made here), other seeds, sizes
and configs. Three sets:

- HEALTHY: configs expected to train well. A run counts as healthy only by a criterion
  independent of the rules: it completed, no logged loss is non-finite, and its last val
  loss is at least HEALTHY_BELOW nats below the unigram entropy. A warning or an error
  on such a run is a false alarm of its rule.
- BROKEN: each built to show one or more rules' problems; a hit is the rule firing.
- REMEDIES: a broken run with one suggestion's change; it helped when the rule no
  longer fires and the last val loss is lower than the broken run's.

About 10 minutes of one core on the dev box; a run already in the store is not trained
again, so an interrupted run of the script picks up where it stopped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from blockviz.core import spec  # noqa: E402
from blockviz.store import RunStore  # noqa: E402
from blockviz.views.run_findings import read_findings  # noqa: E402
from tests.finding_runs import noisy_repeat  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "findings-calibration.json"
# A healthy run's last val loss lies at least this far below the unigram entropy.
HEALTHY_BELOW = 0.5
TINY = (
    *("--preset", "tiny", "--eval_interval", "50", "--eval_iters", "4"),
    *("--probe_interval", "10", "--sample_interval", "1000", "--ckpt_interval", "0"),
)
MID = (*TINY, "--n_layer", "4", "--n_head", "4", "--d_model", "64")
CONSTANT = ("--warmup_steps", "0", "--lr_schedule", "constant")
SHAKES = ("--dataset", "shakespeare")
PYCODE = ("--dataset", "pycode")
OK = ("--lr", "3e-3", "--warmup_steps", "30", "--max_steps", "400")

HEALTHY: dict[str, tuple[str, ...]] = {
    **{f"shakespeare-s{s}": (*TINY, *SHAKES, *OK, "--seed", str(s)) for s in (1, 2, 3, 4)},
    **{f"pycode-s{s}": (*TINY, *PYCODE, *OK, "--seed", str(s)) for s in (1, 2)},
    **{f"pydocs-s{s}": (*TINY, *OK, "--seed", str(s)) for s in (1, 2)},
    "post-warmup": (*TINY, *SHAKES, *OK, "--norm_position", "post", "--warmup_steps", "50"),
    "rmsnorm-swiglu": (*TINY, *SHAKES, *OK, "--norm_type", "rmsnorm", "--activation", "swiglu"),
    "relu": (*TINY, *SHAKES, *OK, "--activation", "relu", "--seed", "5"),
    "gpt2-init": (*TINY, *SHAKES, *OK, "--init", "gpt2", "--seed", "6"),
    "dropout": (*TINY, *SHAKES, *OK, "--dropout", "0.1", "--seed", "7"),
    "lr-1e-2": (*TINY, *SHAKES, *OK, "--lr", "1e-2", "--seed", "8"),
    "mid-shakespeare": (*MID, *SHAKES, *OK, "--warmup_steps", "50"),
    "mid-pycode": (*MID, *PYCODE, *OK, "--warmup_steps", "50", "--seed", "2"),
    "playground": (
        *("--preset", "playground", *SHAKES, "--max_steps", "500", "--eval_interval", "50"),
        *("--eval_iters", "4", "--probe_interval", "10", "--sample_interval", "1000"),
        *("--ckpt_interval", "0"),
    ),
    "attention-only": (*TINY, *SHAKES, *OK, "--ffn", "false", "--seed", "9"),
    "ffn-only": (*TINY, *SHAKES, *OK, "--attention", "false", "--seed", "10"),
    "tied": (*TINY, *PYCODE, *OK, "--tie_weights", "true", "--seed", "11"),
    "no-norms": (*TINY, *PYCODE, *OK, "--norm_position", "none", "--seed", "12"),
    "qk-norm": (*TINY, *SHAKES, *OK, "--qk_norm", "true", "--seed", "13"),
    "ctx-64": (*TINY, *SHAKES, *OK, "--block_size", "64", "--batch_size", "16", "--seed", "14"),
    "heads-4-500": (*TINY, *OK, "--n_head", "4", "--max_steps", "500", "--seed", "15"),
}

# label -> (the rules it is built to show, its flags). {spiky}, {small}, {repeat}, {tiny}:
# texts made here.
NO_NORMS_HOT = ("--norm_position", "none", "--grad_clip", "0", *CONSTANT)
BLOW_UP = (*NO_NORMS_HOT, "--lr", "0.3", "--max_steps", "30", "--probe_interval", "5")
OVERFIT = (*TINY, *OK, "--max_steps", "600", "--d_model", "64", "--weight_decay", "0")
OVERFIT += ("--dataset", "{small}", "--eval_interval", "25")
BROKEN: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "diverge-lr3": (
        ("diverged",),
        (*TINY, *SHAKES, *NO_NORMS_HOT, "--lr", "3", "--max_steps", "40"),
    ),
    "diverge-lr10": (
        ("diverged",),
        (*TINY, *SHAKES, *NO_NORMS_HOT, "--lr", "10", "--max_steps", "40", "--seed", "2"),
    ),
    "diverge-relu-lr10": (
        ("diverged",),
        (*MID, *PYCODE, *NO_NORMS_HOT, "--activation", "relu", "--lr", "10", "--max_steps", "20"),
    ),
    "blow-up-shakespeare": (
        ("output_logit_growth",),
        (*TINY, *SHAKES, *BLOW_UP),
    ),
    "blow-up-pycode": (
        ("output_logit_growth",),
        (*TINY, *PYCODE, *BLOW_UP),
    ),
    "post-lr0.1": (
        ("stalled", "gradient_depth", "slow_updates", "rank_collapse"),
        (*TINY, *SHAKES, *CONSTANT, "--norm_position", "post", "--lr", "0.1", "--max_steps", "300"),
    ),
    "post-lr0.03-mid": (
        ("stalled", "gradient_depth", "slow_updates"),
        (*MID, *PYCODE, *CONSTANT, "--norm_position", "post", "--lr", "0.03", "--max_steps", "300"),
    ),
    "pre-lr0.2": (
        ("stalled", "attention_collapse", "attention_logit_growth", "residual_growth"),
        (*TINY, *SHAKES, *CONSTANT, "--lr", "0.2", "--max_steps", "300", "--seed", "2"),
    ),
    "mid-lr0.01": (
        ("attention_logit_growth",),
        (*MID, *SHAKES, "--warmup_steps", "0", "--lr", "0.01", "--max_steps", "300", "--seed", "5"),
    ),
    "lr-1e-5": (
        ("stalled",),
        (*TINY, *PYCODE, *CONSTANT, "--lr", "1e-5", "--min_lr", "1e-6", "--max_steps", "300"),
    ),
    "no-residual-8": (
        ("stalled", "gradient_depth", "rank_collapse"),
        (*TINY, *SHAKES, *OK, "--residual", "false", "--n_layer", "8", "--seed", "3"),
    ),
    "spiky-shakespeare": (
        ("loss_spike",),
        (*TINY, *OK, "--grad_clip", "0", "--dataset", "{spiky}", "--seed", "2"),
    ),
    "spiky-shakespeare-s3": (
        ("loss_spike",),
        (*TINY, *OK, "--grad_clip", "0", "--dataset", "{spiky}", "--seed", "3"),
    ),
    "spiky-repeat": (
        ("loss_spike",),
        (*TINY, *OK, "--grad_clip", "0", "--dataset", "{repeat}", "--seed", "2"),
    ),
    "lr1": (("large_updates",), (*TINY, *SHAKES, *CONSTANT, "--lr", "1", "--max_steps", "60")),
    "lr0.5-pycode": (
        ("large_updates",),
        (*TINY, *PYCODE, *CONSTANT, "--lr", "0.5", "--max_steps", "100", "--seed", "4"),
    ),
    "relu-lr0.1": (
        ("dead_units", "attention_collapse", "attention_logit_growth", "residual_growth"),
        (*TINY, *SHAKES, *CONSTANT, "--activation", "relu", "--lr", "0.1", "--max_steps", "300"),
    ),
    "relu-lr0.05-mid": (
        ("dead_units",),
        (*MID, *PYCODE, *CONSTANT, "--activation", "relu", "--lr", "0.05", "--max_steps", "300"),
    ),
    "overfit-shakespeare": (
        ("overfitting",),
        OVERFIT,
    ),
    "overfit-s2": (
        ("overfitting",),
        (*OVERFIT, "--seed", "2", "--n_layer", "3"),
    ),
    "overfit-2k": (
        ("overfitting",),
        (*OVERFIT, "--dataset", "{tiny}", "--max_steps", "1500", "--eval_interval", "50"),
    ),
    **{
        f"plateau-lr0.1-s{s}": (
            ("plateau",),
            (*TINY, *SHAKES, *CONSTANT, "--lr", "0.1", "--max_steps", "400", "--seed", str(s)),
        )
        for s in (2, 3)
    },
    "plateau-pydocs": (
        ("plateau",),
        (*TINY, *CONSTANT, "--lr", "0.1", "--max_steps", "400", "--seed", "4"),
    ),
}


# label -> (the rule, the remedy as the suggestion names it, the broken run, extra flags):
# the broken run's flags with the suggestion's change on top (a later flag wins).
BLOWN = "blow-up-shakespeare"
REMEDIES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "diverge-lr3+clip": ("diverged", "clip", "diverge-lr3", ("--grad_clip", "1")),
    "blow-up+z-loss": ("output_logit_growth", "z_loss", BLOWN, ("--z_loss", "1e-4")),
    "blow-up+clip": ("output_logit_growth", "clip", BLOWN, ("--grad_clip", "1")),
    "blow-up+lower-lr": ("output_logit_growth", "lower_lr", BLOWN, ("--lr", "0.1")),
    "blow-up+pre-ln": ("output_logit_growth", "pre_ln", BLOWN, ("--norm_position", "pre")),
    "diverge-lr10+clip": ("diverged", "clip", "diverge-lr10", ("--grad_clip", "1")),
    "diverge-relu-lr10+clip": ("diverged", "clip", "diverge-relu-lr10", ("--grad_clip", "1")),
    "post-lr0.1+warmup": ("stalled", "warmup", "post-lr0.1", ("--warmup_steps", "100")),
    "post-lr0.03-mid+warmup": ("stalled", "warmup", "post-lr0.03-mid", ("--warmup_steps", "100")),
    "post-lr0.1+pre-ln": ("gradient_depth", "pre_ln", "post-lr0.1", ("--norm_position", "pre")),
    "pre-lr0.2+lower-lr": ("stalled", "lower_lr", "pre-lr0.2", ("--lr", "0.067")),
    "pre-lr0.2+qk-norm": ("attention_logit_growth", "qk_norm", "pre-lr0.2", ("--qk_norm", "true")),
    "mid-lr0.01+qk-norm": (
        "attention_logit_growth",
        "qk_norm",
        "mid-lr0.01",
        ("--qk_norm", "true"),
    ),
    "lr-1e-5+higher-lr": ("stalled", "higher_lr", "lr-1e-5", ("--lr", "3e-5")),
    "no-residual-8+residual": ("stalled", "residual", "no-residual-8", ("--residual", "true")),
    "spiky+clip": ("loss_spike", "clip", "spiky-shakespeare", ("--grad_clip", "1")),
    "spiky-repeat+clip": ("loss_spike", "clip", "spiky-repeat", ("--grad_clip", "1")),
    "lr1+lower-lr": ("large_updates", "lower_lr", "lr1", ("--lr", "0.33")),
    "relu-lr0.1+gelu": ("dead_units", "gelu", "relu-lr0.1", ("--activation", "gelu")),
    "relu-lr0.1+lower-lr": ("residual_growth", "lower_lr", "relu-lr0.1", ("--lr", "0.033")),
    "overfit+dropout": ("overfitting", "dropout", "overfit-shakespeare", ("--dropout", "0.1")),
    "overfit-2k+dropout": ("overfitting", "dropout", "overfit-2k", ("--dropout", "0.1")),
    "plateau-s2+lower-lr": ("plateau", "lower_lr", "plateau-lr0.1-s2", ("--lr", "0.033")),
    "plateau-s2+cosine": ("plateau", "cosine", "plateau-lr0.1-s2", ("--lr_schedule", "cosine")),
}

TRAIN_ALL = """
import json, sys
from blockviz import cli
for flags in json.loads(sys.argv[1]):
    code = cli.main(["train", *flags])
    if code:
        print(f"blockviz train {' '.join(flags)} exited {code}", file=sys.stderr)
"""


def spiky_text() -> str:
    """The first 60,000 characters of Tiny Shakespeare with a block of random symbols a
    third of the way in (a batch that draws from it costs far more than the rest)."""
    from blockviz.core.config import RunConfig, replace
    from blockviz.core.corpora import load_corpus

    text = load_corpus(replace(RunConfig(), dataset="shakespeare").data).text[:60_000]
    rng = random.Random(1)
    noise = "".join(rng.choice("0123456789#$%&*+=<>?@^~{}") for _ in range(1_500))
    cut = len(text) // 3
    return text[:cut] + noise + text[cut:]


def repeat_text() -> str:
    """A verse repeated (not tests/finding_runs.py's sentence), with a block of random
    symbols a third of the way in."""
    return noisy_repeat("so shines a good deed in a naughty world, said the queen.\n", seed=2)


def small_text() -> str:
    """4,000 characters of Tiny Shakespeare (from its middle): little enough to memorise."""
    from blockviz.core.config import RunConfig, replace
    from blockviz.core.corpora import load_corpus

    text = load_corpus(replace(RunConfig(), dataset="shakespeare").data).text
    return text[500_000:504_000]


def tiny_text() -> str:
    """2,000 other characters of Tiny Shakespeare: fewer still to memorise."""
    from blockviz.core.config import RunConfig, replace
    from blockviz.core.corpora import load_corpus

    return load_corpus(replace(RunConfig(), dataset="shakespeare").data).text[800_000:802_000]


def all_runs() -> dict[str, tuple[str, ...]]:
    """Every run's flags by label (a remedy: its broken run's flags and its change)."""
    runs = dict(HEALTHY)
    runs.update({label: flags for label, (_, flags) in BROKEN.items()})
    for label, (_, _, base, change) in REMEDIES.items():
        runs[label] = (*BROKEN[base][1], *change)
    return runs


def train(store: Path, labels: list[str]) -> float:
    """Train the runs `labels` into the store, in one process; the seconds it took."""
    folder = store.parent
    makers = {"spiky": spiky_text, "small": small_text, "repeat": repeat_text, "tiny": tiny_text}
    files = {name: folder / f"{name}.txt" for name in makers}
    for name, make in makers.items():
        if not files[name].exists():
            files[name].write_text(make(), encoding="utf-8")
    flags = all_runs()
    commands = [
        [
            *(flag.format(**{k: str(v) for k, v in files.items()}) for flag in flags[label]),
            *("--store", str(store), "--accelerator", "cpu", "--no_progress", "--threads", "1"),
            *("--name", label),
        ]
        for label in labels
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", TRAIN_ALL, json.dumps(commands)], cwd=ROOT, env=env)
    return time.perf_counter() - started


def stored(store: Path) -> dict[str, int]:
    """The runs the store holds, by name (completed or diverged)."""
    if not store.exists():
        return {}
    with RunStore(store, readonly=True) as runs:
        frame = runs.runs_frame()
    done = frame[frame["status"].isin(["completed", "diverged"])]
    return {str(name): int(run_id) for name, run_id in zip(done["name"], done["id"], strict=True)}


def judge(store: Path, ids: dict[str, int]) -> dict[str, dict]:
    """Each run's facts: status, unigram entropy, last val loss, the rules that fired."""
    out = {}
    with RunStore(store, readonly=True) as runs:
        for label, run_id in ids.items():
            run = runs.get_run(run_id)
            found = read_findings(runs, run)
            losses = runs.scalars(run_id, names=[spec.TRAIN_LOSS, spec.VAL_LOSS])
            train_loss = losses[losses["name"] == spec.TRAIN_LOSS]["value"]
            val = losses[losses["name"] == spec.VAL_LOSS]["value"]
            last_val = float(val.iloc[-1]) if len(val) else math.nan
            unigram = float((run.dataset or {}).get("unigram_nats", math.nan))
            finite = bool(train_loss.map(math.isfinite).all()) and math.isfinite(last_val)
            out[label] = {
                "status": str(run.status),
                "unigram": round(unigram, 4),
                "val": round(last_val, 4) if math.isfinite(last_val) else None,
                "headline": found.headline.title,
                "fired": sorted(
                    {f.rule for f in found.findings if f.severity in ("warning", "error")}
                ),
                # what each finding suggested: {rule: remedy}
                "suggested": {
                    f.rule: f.suggestion.remedy
                    for f in found.findings
                    if f.suggestion is not None and f.suggestion.remedy
                },
                "healthy": run.status == "completed"
                and finite
                and last_val <= unigram - HEALTHY_BELOW,
            }
    return out


def rule_table(runs: dict[str, dict]) -> dict[str, dict]:
    """Per rule: false alarms among the healthy runs and hits among its broken runs."""
    from blockviz.core.findings import RULES

    healthy = [label for label in HEALTHY if runs[label]["healthy"]]
    table = {}
    for rule in RULES:
        built = [label for label, (rules, _) in BROKEN.items() if rule in rules]
        table[rule] = {
            "healthy_runs": len(healthy),
            "false_alarms": sorted(label for label in healthy if rule in runs[label]["fired"]),
            "broken_runs": len(built),
            "hits": sorted(label for label in built if rule in runs[label]["fired"]),
            "missed": sorted(label for label in built if rule not in runs[label]["fired"]),
        }
    return table


def remedy_table(runs: dict[str, dict]) -> list[dict]:
    """Each remedy run against its broken run, for the rule it was made for and every rule
    that fired on the broken run: the rule before and after, the val losses, whether that
    rule's finding suggested this remedy, and whether it helped (the rule silent after, the
    run completed, its val loss lower)."""
    rows = []
    for label, (made_for, remedy, base, change) in REMEDIES.items():
        before, after = runs[base], runs[label]
        for rule in dict.fromkeys([made_for, *before["fired"]]):
            fixed = rule not in after["fired"] and after["status"] == "completed"
            lower = before["val"] is None or (after["val"] or math.inf) < before["val"]
            rows.append(
                {
                    "rule": rule,
                    "remedy": remedy,
                    "run": label,
                    "base": base,
                    "change": " ".join(change),
                    "suggested": before["suggested"].get(rule) == remedy,
                    "fired_before": rule in before["fired"],
                    "fired_after": rule in after["fired"],
                    "val_before": before["val"],
                    "val_after": after["val"],
                    "helped": bool(
                        rule in before["fired"] and fixed and after["val"] is not None and lower
                    ),
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=Path("/tmp/blockviz-calibration/runs.db"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--machine",
        default=f"{platform.machine()}, {os.cpu_count()} cores",
        help="the machine, as the results name it",
    )
    args = parser.parse_args()
    args.store.parent.mkdir(parents=True, exist_ok=True)
    labels = list(all_runs())
    missing = [label for label in labels if label not in stored(args.store)]
    if missing:
        print(f"trained {len(missing)} runs in {train(args.store, missing):.0f} s", file=sys.stderr)
    ids = stored(args.store)
    if set(labels) - set(ids):
        print(f"runs that did not finish: {sorted(set(labels) - set(ids))}", file=sys.stderr)
        return 1
    runs = judge(args.store, {label: ids[label] for label in labels})
    load = os.getloadavg()
    result = {
        "command": "python benchmarks/findings_calibration.py",
        "machine": f"{args.machine}; one thread per run, CPU",
        "date": dt.date.today().isoformat(),
        "load_average": round(load[0], 2),
        "healthy_criterion": (
            f"completed, every logged loss finite, last val loss at least {HEALTHY_BELOW:g} "
            "nat below the unigram entropy"
        ),
        "healthy_set": list(HEALTHY),
        "flags": {label: " ".join(flags) for label, flags in all_runs().items()},
        "runs": runs,
        "rules": rule_table(runs),
        "remedies": remedy_table(runs),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
