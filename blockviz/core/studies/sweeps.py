"""Custom sweeps: any config fields × values × seeds as a study without claims (torch-free).

Values come as text, `a,b,c` or a log range `low:high:n` (`parse_values`), from the
Studies page's form and `python -m blockviz study sweep`; a bad field or value is a
ConfigError that names both.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from blockviz.core import config as cfg
from blockviz.core.config import RunConfig
from blockviz.core.fields import ConfigError
from blockviz.core.studies.define import (
    MAX_STUDY_RUNS,
    MAX_VALUES,
    StudyDef,
    Variant,
    check_study,
    log_space,
    seeds_for,
    sized_base,
)


def parse_values(name: str, text: str) -> list[Any]:
    """A swept field's values from text: `a,b,c` or a log range `low:high:n`.

    ConfigError names the field and the value that is wrong.
    """
    try:
        section = cfg.section_of(name)
    except ConfigError:
        raise ConfigError(name, text, "is not a config field") from None
    annotation = cfg.field_types(cfg.SECTIONS[section])[name]
    raw = str(text).strip()
    if not raw:
        raise ConfigError(name, text, "give values as a,b,c or a log range low:high:n")
    if raw.count(":") == 2:
        low_text, high_text, n_text = raw.split(":")
        try:
            low, high, n = float(low_text), float(high_text), int(n_text)
        except ValueError:
            raise ConfigError(name, text, "a log range is low:high:n, e.g. 1e-4:1e-1:7") from None
        if not (0 < low < high and math.isfinite(high)) or not 2 <= n <= MAX_VALUES:
            raise ConfigError(
                name, text, f"a log range needs 0 < low < high and 2 to {MAX_VALUES} values"
            )
        if annotation is int:
            # Whole numbers inside the range: rounding may not cross a bound either.
            first, last = math.ceil(low), math.floor(high)
            if first > last:
                raise ConfigError(name, text, "holds no whole number between low and high")
            return sorted({min(max(round(v), first), last) for v in log_space(low, high, n)})
        values: list[Any] = log_space(low, high, n)
        if len(set(values)) < n:
            raise ConfigError(
                name, text, "repeats a value at 3 significant digits; ask for fewer values"
            )
        return values
    parts = [p.strip() for p in raw.split(",")]
    if any(not p for p in parts):
        raise ConfigError(name, text, "has an empty value between commas")
    if len(parts) > MAX_VALUES:
        raise ConfigError(name, text, f"has more than {MAX_VALUES} values")
    values = [cfg.coerce(name, p, annotation) for p in parts]
    if len(set(map(repr, values))) != len(values):
        raise ConfigError(name, text, "lists a value twice")
    return values


def _shown(value: Any) -> str:
    if isinstance(value, float):
        short = f"{value:.3g}"
        return short if float(short) == value else repr(value)  # never a value not swept
    return str(value).lower() if isinstance(value, bool) else str(value)


def _check_size(grid: Mapping[str, Sequence[Any]], n_seeds: int) -> None:
    """Refuse a grid of more than MAX_STUDY_RUNS runs, counted without building it."""
    n_runs = math.prod(len(values) for values in grid.values()) * n_seeds
    if n_runs > MAX_STUDY_RUNS:
        sizes = " × ".join(f"{len(values)} {name}" for name, values in grid.items())
        raise ConfigError(
            "sweep",
            f"{n_runs:,} runs",
            f"is more than {MAX_STUDY_RUNS}; sweep fewer values or seeds",
            message=(
                f"sweep: {sizes} × {n_seeds} seed{'s' if n_seeds > 1 else ''} = {n_runs:,} "
                f"runs, more than the {MAX_STUDY_RUNS} a study may hold; sweep fewer values "
                "or seeds"
            ),
        )


def sweep(
    grid: Mapping[str, Sequence[Any]],
    seeds: int | str | None = None,
    base: RunConfig | None = None,
    size: str | None = None,
    max_steps: int | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> StudyDef:
    """A custom sweep: every combination of the fields' values × seeds, no claims.

    `base` is the config the sweep starts from (default RunConfig()); `size`, when given,
    applies a size preset on top of it, `fixed` fields (set for every run, e.g. from the
    command line) go on top of that, and `max_steps` then sets the length of every run
    (the warm-up kept at most a tenth of it). `seeds` as `define.seeds_for` takes them (a
    count, or text such as `5-8`); None is one seed per variant, or
    `define.GPU_SEEDS` where the runs train on a GPU. ConfigError names the first bad
    field or value.
    """
    if not grid:
        raise ConfigError("sweep", "", "name at least one field to sweep, e.g. --lr 1e-4:1e-1:7")
    base_config = base or RunConfig()
    flat: dict[str, Any] = {}
    for section in cfg.SECTIONS:
        flat.update(base_config.to_dict()[section])
    if size is not None:
        flat.update(sized_base(size, {}))
    for name, value in (fixed or {}).items():
        cfg.section_of(name)
        flat[name] = value
    if max_steps is not None:
        flat["max_steps"] = max_steps
        flat["warmup_steps"] = min(int(flat.get("warmup_steps", 0)), max_steps // 10)
    if "seed" in grid:
        raise ConfigError("seed", grid["seed"], "use the seeds count, not a seed sweep")
    for name, values in grid.items():
        cfg.section_of(name)
        if not values:
            raise ConfigError(name, "", "needs at least one value")
    seed_list = seeds_for(seeds, None, flat.get("accelerator", "auto"))
    _check_size(grid, len(seed_list))  # before building: 50**4 combinations fill the memory
    combos = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    if "lr" in grid and "min_lr" not in grid and flat.get("lr"):
        # The decay floor keeps its ratio to the peak, so a small swept lr stays valid.
        ratio = float(flat.get("min_lr", 0.0)) / float(flat["lr"])
        combos = [{**c, "min_lr": float(f"{c['lr'] * ratio:.3g}")} for c in combos]
    variants = tuple(
        Variant(" · ".join(f"{n} {_shown(combo[n])}" for n in grid), combo) for combo in combos
    )
    study = StudyDef(
        key="sweep",
        title="Sweep of " + ", ".join(grid),
        question="How does the final loss change with " + ", ".join(grid) + "?",
        claims=(),
        variants=variants,
        swept=tuple(grid),
        baseline=variants[0].label,
        base=flat,
        seeds=seed_list,
        size=size or "custom",
    )
    check_study(study)
    return study
