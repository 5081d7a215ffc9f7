"""Export a run as code: one self-contained `train_<name>.py` (PyTorch only, no blockviz).

`script_text(config, name)` writes the run's config as constants at the top of a script
that reads a text file into blockviz's character dataset and split, builds the same
model, and trains it with the same optimizer, schedule, clipping, batches and seeding, so
that on a CPU in float32 its training losses equal blockviz's (tests/views/export/test_codegen.py
trains both). Its flags (--data, --max_steps, --lr, --seed, --device) default to the
run's values and change the run as those fields change blockviz's. The body is
`codegen_template.SCRIPT_BODY`; this module only fills in the header, which says how to
use the flags and what the script does not reproduce for this config, and the constants.
Torch-free: the dashboard offers the download without importing torch.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Any

from blockviz import __version__
from blockviz.core import evaluation
from blockviz.core.config import BOUNDS, FIELDS, RunConfig
from blockviz.core.corpora import BUILTIN
from blockviz.core.naming import sanitize_name
from blockviz.store import RunRecord, RunStore
from blockviz.views.export.codegen_template import SCRIPT_BODY
from blockviz.views.export.outfolder import ExportError, OutFolder, safe_filename
from blockviz.views.export.report import selected_runs

MIME = "text/x-python"

_IMPORTS = """import argparse
import codecs
import math
import time
import urllib.request
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
"""

# The constants of the config block: the fields whose registry entry says how the script
# spells them (`ConfigField.code`, the comment beside each); a field left out is named in
# the header.
CONSTANTS = tuple(spec for spec in FIELDS.values() if spec.code is not None)
# Fields that change what a run computes (a resume may not change them) but have no constant
# here; the text and the vocabulary are the script's input, the ops fields named above.
_UNBUILT = tuple(
    spec
    for spec in FIELDS.values()
    if spec.code is None
    and not spec.resume
    and spec.section != "data"
    and spec.name != "vocab_size"
)


def script_filename(name: str) -> str:
    """`train_<name>.py` with the name sanitised (letters, digits, `._-` only)."""
    return safe_filename(f"train_{sanitize_name(name)}", "py")


def default_text(dataset: str) -> str:
    """What the script reads when no file is given: a built-in corpus's name, or a file name."""
    if dataset in BUILTIN:
        return dataset
    return PurePath(dataset).name or dataset


def not_reproduced(config: RunConfig) -> list[str]:
    """What of this run the script leaves out or does differently, one sentence each."""
    train, data = config.train, config.data
    notes = []
    if data.dataset == "ops":
        notes.append(
            "The run trained on blockviz's synthetic ops task, which this script does not "
            "generate (ops_examples, ops_min_args, ops_max_args, ops_seed): give it a text file."
        )
    elif data.dataset == "pycode":
        notes.append(
            "The run trained on blockviz's pycode corpus (standard-library .py files), which "
            "this script does not gather: give it a text file."
        )
    elif data.dataset not in BUILTIN:
        notes.append(
            "The run's text file is named by DATASET without its folder (the run's path "
            "need not exist here): pass the file's path if it lies elsewhere."
        )
    if train.devices > 1 or train.num_nodes > 1 or train.strategy != "auto":
        notes.append(
            f"The run used devices={train.devices}, num_nodes={train.num_nodes}, "
            f"strategy={train.strategy}; the script trains on one device."
        )
    if train.logger != "none":
        notes.append(f"The run also wrote {train.logger} logs; the script only prints.")
    values = {name: value for part in config.to_dict().values() for name, value in part.items()}
    for spec in _UNBUILT:  # a field of the maths the script does not spell (a new toggle)
        if values[spec.name] != spec.default:
            notes.append(
                f"The run set {spec.name} to {values[spec.name]!r}, which this script does "
                "not build: its losses will not be blockviz's."
            )
    notes.append(
        "blockviz's probes (gradient norms, activation statistics, update ratios, attention "
        "maps, samples during training), the run store and checkpoints are not part of it."
    )
    notes.append(
        "Equality with blockviz's losses is tested on a CPU in float32 only; on a GPU or "
        "with mixed precision it has not been measured."
    )
    return notes


def _wrap(text: str, prefix: str, width: int = 92) -> list[str]:
    """`text` as lines of at most `width` characters, the first after `prefix`."""
    return textwrap.wrap(text, width, initial_indent=prefix, subsequent_indent=" " * len(prefix))


def _schedule_note(config: RunConfig) -> str:
    """What a new --max_steps does to this run's learning-rate schedule, as blockviz plans it."""
    train = config.train
    warmup = (
        "the WARMUP_STEPS warm-up steps are kept (so --max_steps may not be fewer), then"
        if train.warmup_steps
        else "there is no warm-up (WARMUP_STEPS is 0), and"
    )
    after = (
        "the learning rate stays at --lr"
        if train.lr_schedule == "constant"
        else f"the {train.lr_schedule} decay reaches MIN_LR at the last step"
    )
    return (
        "A new --max_steps trains that many steps with the schedule blockviz plans for a run "
        f"of that length: {warmup} {after}; the validation loss still comes every "
        "EVAL_INTERVAL steps and after the last. With other values of these flags the script "
        "trains as blockviz would train the run's config changed to them."
    )


def _header(config: RunConfig, name: str, filename: str) -> str:
    example_steps = min(2 * config.train.max_steps, int(BOUNDS["max_steps"].high))
    lines = [
        f'"""{filename}: the blockviz run {name} as one PyTorch script.',
        "",
        *_wrap(
            f"Generated by blockviz {__version__}. It needs Python and PyTorch, nothing else. "
            f"To train on input.txt for {example_steps} steps on a CUDA GPU:",
            "",
        ),
        "",
        f"    python {filename} --data input.txt --max_steps {example_steps} --device cuda",
        "",
        *_wrap(
            "Each flag defaults to the run's value below (--help lists them): --data DATASET "
            "(a UTF-8 text file, or pydocs / shakespeare, which the script builds / "
            "downloads), --max_steps MAX_STEPS, --lr LR (the peak learning rate), --seed SEED "
            "(the weights, dropout and training batches; the validation windows keep "
            "EVAL_SEED) and --device ACCELERATOR (auto, cpu, gpu, cuda or mps). A value "
            "blockviz would refuse for the field, a missing file or a device torch cannot "
            "find stops it with one line and exit status 2.",
            "",
        ),
        "",
        *_wrap(_schedule_note(config), ""),
        "",
        *_wrap(
            "The script reads the text as blockviz does "
            "(UTF-8, a byte-order mark dropped, Windows line ends made Unix ones), takes its "
            "sorted characters as the "
            "vocabulary and its last VAL_FRACTION as validation, builds the same model, and "
            "trains it with the same AdamW groups, learning-rate schedule, clipping, batches "
            "and seeding. Every LOG_INTERVAL steps it prints the mean training loss of those "
            "steps (each the loss of its batch before its update), and every EVAL_INTERVAL "
            "steps the validation loss."
            + (
                " The printed losses are cross-entropies, as blockviz logs them; the Z_LOSS "
                "term is added only to what is trained on."
                if config.train.z_loss > 0
                else ""
            ),
            "",
        ),
        "",
        "Not reproduced:",
    ]
    for note in not_reproduced(config):
        lines.extend(_wrap(note, "- "))
    lines.append('"""')
    return "\n".join(lines) + "\n"


def _literal(value: Any) -> str:
    """Python source for a config value; strings in double quotes (JSON's escapes are Python's)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _constants(config: RunConfig) -> str:
    parts = config.to_dict()
    lines = [
        "# -----------------------------------------------------------------------------",
        "# the run's config (the vocabulary size comes from the text)",
        "",
    ]
    section = None
    for spec in CONSTANTS:
        if spec.section != section:
            if section is not None:
                lines.append("")
            lines.append(f"# {spec.section}")
            section = spec.section
        value: Any = parts[spec.section][spec.name]
        line = f"{spec.name.upper()} = {_literal(value)}"
        lines.append(f"{line}  # {spec.code}" if spec.code else line)
    lines.append(f"DATASET = {_literal(default_text(config.data.dataset))}  # --data's default")
    lines.append(f"EVAL_SEED = {evaluation.EVAL_SEED}  # validation windows' seed, for every run")
    lines.append(f"EVAL_DRAW = {evaluation.EVAL_DRAW}  # windows drawn at a time")
    lines += [
        "",
        "# the most --max_steps, --lr and --seed accept: blockviz's bounds on those fields",
        *(f"{name.upper()}_LIMIT = {BOUNDS[name].high!r}" for name in ("max_steps", "lr", "seed")),
        "",
        "if FINAL_NORM is None:",
        '    USE_FINAL_NORM = NORM_POSITION == "pre"',
        "else:",
        '    USE_FINAL_NORM = FINAL_NORM and NORM_POSITION != "none"',
    ]
    return "\n".join(lines) + "\n"


def script_text(config: RunConfig, name: str) -> str:
    """The whole `train_<name>.py` for `config` (validated first: ConfigError if invalid)."""
    config.validate()
    shown = sanitize_name(name)
    filename = script_filename(name)
    return "\n".join([_header(config, shown, filename), _IMPORTS, _constants(config) + SCRIPT_BODY])


def run_script(run: RunRecord) -> tuple[str, str]:
    """(file name, script text) of a stored run (a `RunStore.get_run` row)."""
    if not run.config:
        raise ExportError(f"run {run.id} has no stored config to export as code")
    config = RunConfig.from_dict(run.config)
    return script_filename(run.name), script_text(config, run.name)


def export_code_to_folder(
    store: RunStore, run_ids: Sequence[int | str], out_dir: Path
) -> list[Path]:
    """Write `train_<name>.py` for each run under out_dir (`-<id>` added if names clash)."""
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ExportError(f"--out {out_dir} exists and is not a folder")
    scripts = []
    for run in selected_runs(store, run_ids):
        filename, text = run_script(run)
        scripts.append((run.id, filename, text))
    written: list[Path] = []
    taken: set[str] = set()
    with OutFolder(out_dir) as out:
        for run_id, filename, text in scripts:
            if filename.lower() in taken:
                filename = f"{filename.removesuffix('.py')}-{run_id}.py"
            taken.add(filename.lower())
            written.append(out.write(filename, text))
    return written
