"""Studies: a question about the block, the claims it tests, and the runs that answer it.

A study is a grid of variants (config overrides) × seeds on one base config, sized by a
preset: `quick` (minutes on a 2-core laptop CPU), `standard` (the baby-cpu model, 2,000
steps, 3 seeds) or `full` (for a GPU). Each claim names a verdict rule
(`studies.verdicts`) that decides from the measured runs whether the data support it;
nothing here says what the answer is. This module holds the machinery: `Claim`,
`Variant`, `StudyDef`, the sizes and the checks every study passes. The built-in studies
are `studies/builtins.py`; a custom sweep (`studies/sweeps.py`) is a study without claims.

The definition is stored with the study as JSON (`to_spec`), so the page, the CLI and the
export read back exactly what ran (`plan_from_spec`). Torch-free and streamlit-free.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from blockviz.core import config as cfg
from blockviz.core import hardware, replicas
from blockviz.core.config import RunConfig
from blockviz.core.fields import ConfigError

SIZES = ("quick", "standard", "full")
MAX_STUDY_RUNS = 500  # a bigger grid is refused: it would take days on a laptop
MAX_SEEDS = 20
MAX_VALUES = 50  # values of one swept field
FIRST_SEED = 1  # a seed count n means FIRST_SEED ... FIRST_SEED + n - 1 (`parse_seeds`)

# What each size trains: flat config overrides on RunConfig() (= the baby-cpu preset),
# and the seeds each variant gets. Logging is sparse: a study reads final numbers and a
# val-loss curve. Probes come often enough for the findings: step 0, then at least three
# more (every quarter or third of the run, and the last step), since a rule about a state
# needs two probes in a row; samples come once, at the end.
# A study's runs keep no interval checkpoints (a fork point per run, times every run of a
# study, is disk nobody asked for); last.ckpt still lets each resume.
_SPARSE = {"log_interval": 10, "eval_iters": 10, "ckpt_interval": 0}
SIZE_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        **_SPARSE,
        "n_layer": 2,
        "n_head": 2,
        "d_model": 64,
        "block_size": 64,
        "batch_size": 16,
        "max_steps": 300,
        "warmup_steps": 30,
        "eval_interval": 100,
        "probe_interval": 100,
        "sample_interval": 300,
    },
    "standard": {
        **_SPARSE,
        "max_steps": 2000,
        "warmup_steps": 200,
        "eval_interval": 250,
        "probe_interval": 500,
        "sample_interval": 2000,
    },
    "full": {
        **_SPARSE,
        "n_layer": 6,
        "n_head": 8,
        "d_model": 256,
        "block_size": 128,
        "batch_size": 64,
        "max_steps": 5000,
        "warmup_steps": 500,
        "eval_interval": 500,
        "probe_interval": 1250,
        "sample_interval": 5000,
    },
}
SIZE_SEEDS = {"quick": 2, "standard": 3, "full": 5}  # on a CPU; a sweep's: 1
# On a GPU every size defaults to more seeds: a variant's seeds, and the runs that differ
# only in what a replica keeps on its own (lr, weight decay, ...), train together as
# replicas of one batched model (`core/replicas.py`, up to GPU_REPLICAS at once), not one
# after another: one variant's seeds are one batch. What a batch costs on a given GPU is
# `benchmarks/gpu_check.py`'s to measure.
GPU_SEEDS = 8
# What the page says of each size beside the seeds chosen and its time estimate for
# this machine: the model and the steps, no time of its own to contradict the estimate.
SIZE_DESCRIPTIONS = {
    "quick": "2 layers (unless the study varies depth), d_model 64, 300 steps",
    "standard": "the baby-cpu model (4 layers, d_model 128), 2,000 steps",
    "full": "6 layers, d_model 256, 5,000 steps, meant for a GPU",
}


@dataclass(frozen=True)
class Claim:
    """A claim quoted as a claim, with its source and the rule that judges it."""

    text: str
    source: str
    rule: str  # a name in blockviz.core.studies.verdicts.RULES
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Variant:
    """One cell of the grid: a label and the config fields it sets."""

    label: str
    overrides: Mapping[str, Any]


@dataclass(frozen=True)
class StudyDef:
    """A study at one size: what it asks, what it tests, and what it runs."""

    key: str
    title: str
    question: str
    claims: tuple[Claim, ...]
    variants: tuple[Variant, ...]
    swept: tuple[str, ...]  # the fields the variants set, in the order charts use them
    baseline: str  # the variant label times and parameters are relative to
    base: Mapping[str, Any] = field(default_factory=dict)  # flat overrides on RunConfig()
    seeds: tuple[int, ...] = (FIRST_SEED,)
    size: str = "quick"
    trains: bool = True  # init-gradients measures at initialisation only

    def config_for(self, label: str, seed: int | None = None) -> RunConfig:
        """The validated RunConfig of one variant (and seed)."""
        variant = self.variant(label)
        overrides = {**self.base, **variant.overrides}
        if seed is not None:
            overrides["seed"] = int(seed)
        try:
            return cfg.replace(RunConfig(), **overrides).validate()
        except ConfigError as exc:
            raise ConfigError(exc.field, exc.value, f"{exc.allowed} (variant {label})") from None

    def variant(self, label: str) -> Variant:
        for variant in self.variants:
            if variant.label == label:
                return variant
        raise KeyError(f"no variant {label!r} in study {self.key}")

    def grid(self) -> list[tuple[Variant, int, RunConfig]]:
        """Every run: (variant, seed, config), variants in order, seeds within each."""
        return [
            (variant, seed, self.config_for(variant.label, seed))
            for variant in self.variants
            for seed in self.seeds
        ]

    @property
    def n_runs(self) -> int:
        return len(self.variants) * len(self.seeds) if self.trains else 0

    def to_spec(self) -> dict[str, Any]:
        """Plain JSON-able dict; `plan_from_spec` reads it back."""
        return dataclasses.asdict(self)


def plan_from_spec(spec: Mapping[str, Any]) -> StudyDef:
    """The StudyDef a study was stored with (`StudyDef.to_spec`)."""
    data = dict(spec)
    data["claims"] = tuple(Claim(**c) for c in data.get("claims", ()))
    data["variants"] = tuple(Variant(**v) for v in data.get("variants", ()))
    data["swept"] = tuple(data.get("swept", ()))
    data["seeds"] = tuple(int(s) for s in data.get("seeds", (FIRST_SEED,)))
    return StudyDef(**data)


def log_space(low: float, high: float, n: int) -> list[float]:
    """n values from low to high, evenly spaced on a log scale: the ends exactly as given,
    the values between rounded to 3 digits but never past an end (0.999999 stays below 1)."""
    if n == 1:
        return [float(low)]
    step = (math.log10(high) - math.log10(low)) / (n - 1)
    inner = [float(f"{10 ** (math.log10(low) + i * step):.3g}") for i in range(1, n - 1)]
    return [float(low), *(min(max(value, low), high) for value in inner), float(high)]


def sized_base(size: str, base: Mapping[str, Any]) -> dict[str, Any]:
    if size not in SIZE_PRESETS:
        raise ConfigError("size", size, "choose one of " + ", ".join(SIZES))
    return {**SIZE_PRESETS[size], **base}


def on_gpu(accelerator: str = "auto") -> bool:
    """Whether runs with this accelerator setting train on a GPU here: `gpu`, or `auto`
    where this machine shows one (`hardware.visible_gpus`: torch-free, as the UI needs)."""
    return accelerator == "gpu" or (accelerator == "auto" and hardware.visible_gpus() > 0)


def default_seeds(size: str | None, accelerator: str = "auto") -> int:
    """Seeds per variant when none are asked for: GPU_SEEDS where the runs train on a GPU,
    else the size's SIZE_SEEDS (a sweep, size None: 1)."""
    if on_gpu(accelerator):
        return GPU_SEEDS
    return SIZE_SEEDS[size] if size is not None else 1


def seeds_note(accelerator: str = "auto") -> str | None:
    """Why a GPU study has more seeds by default, for the page and the CLI (None on a CPU,
    where the defaults are the sizes' own)."""
    if not on_gpu(accelerator):
        return None
    cpu = ", ".join(f"{size} {n}" for size, n in SIZE_SEEDS.items())
    return (
        f"on a GPU every size defaults to {GPU_SEEDS} seeds per variant (on a CPU: {cpu}): a "
        "variant's seeds, and variants that differ only in lr, weight decay or another "
        "per-replica field, train together as replicas of one batched model (up to "
        f"{replicas.GPU_REPLICAS} at once), not one after another"
    )


SEEDS_HELP = "a count (4: seeds 1-4), a range (5-8) or a list (5,7,9)"


def parse_seeds(text: str) -> tuple[int, ...]:
    """A study's seeds from text: a count `4` (seeds FIRST_SEED, FIRST_SEED + 1, ...), a
    range `5-8` or a list `5,7,9` (both at once too: `1,5-7`), at most MAX_SEEDS of them;
    ConfigError names what is wrong (empty, negative, reversed, a seed twice, too many, not
    a number). The CLI's `--seeds` and the Studies page's field both read seeds here."""
    words = str(text).strip()
    if not words:
        raise ConfigError("seeds", words, "", message=f"seeds: none given; give {SEEDS_HELP}")
    if words.isascii() and words.isdigit():
        count = int(words)
        if not 1 <= count <= MAX_SEEDS:
            raise ConfigError(
                "seeds", count, f"a count must be from 1 to {MAX_SEEDS} (or give a range or list)"
            )
        return tuple(range(FIRST_SEED, FIRST_SEED + count))
    try:
        seeds = replicas.parse_seeds(words, limit=MAX_SEEDS)
    except ValueError as exc:
        why = str(exc).replace("0,1,2 or 0-3", SEEDS_HELP)
        raise ConfigError("seeds", words, why, message=f"seeds: {why}") from None
    return tuple(seeds)


def seeds_for(
    seeds: int | str | None, size: str | None, accelerator: str = "auto"
) -> tuple[int, ...]:
    """The seeds a study runs: None is `default_seeds` of them from FIRST_SEED; a number n
    is FIRST_SEED ... FIRST_SEED + n - 1; text is read by `parse_seeds`."""
    if isinstance(seeds, str):
        return parse_seeds(seeds)
    count = default_seeds(size, accelerator) if seeds is None else seeds
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SEEDS:
        raise ConfigError("seeds", count, f"must be a whole number from 1 to {MAX_SEEDS}")
    return tuple(range(FIRST_SEED, FIRST_SEED + count))


def seeds_text(seeds: Sequence[int]) -> str:
    """Seeds as people write them: `1–4` for a run of consecutive ones, else `1, 3, 5`."""
    ordered = sorted(seeds)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}–{ordered[-1]}"
    return ", ".join(map(str, ordered))


def check_study(study: StudyDef) -> None:
    """Every run's config validates and the grid is within bounds."""
    if study.n_runs > MAX_STUDY_RUNS:
        raise ConfigError(
            "study",
            f"{study.n_runs} runs",
            f"is more than {MAX_STUDY_RUNS}; sweep fewer values or seeds",
        )
    labels = [v.label for v in study.variants]
    if len(set(labels)) != len(labels):
        raise ConfigError("variants", labels, "labels must be unique")
    for variant in study.variants:
        study.config_for(variant.label)


def swept_value(study: StudyDef, label: str, name: str) -> Any:
    """The value a variant has for a swept column (a config field, or `warmup`: on/off)."""
    config = study.config_for(label)
    if name == "warmup":
        return "on" if config.train.warmup_steps > 0 else "off"
    return getattr(getattr(config, cfg.section_of(name)), name)
