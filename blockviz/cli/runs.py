"""`python -m blockviz runs | show | stop`: the run store read and steered from a terminal.

Torch-free, so these commands start at once: they read the store (or, for `stop`, hand
over to `runner.stop_run`, the same stop as the dashboard's) and print.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from typing import Any

from blockviz import CLI
from blockviz.core import config as cfg
from blockviz.core import disk, evaluation
from blockviz.core.fields import ConfigError
from blockviz.core.forks import changes_text
from blockviz.core.spec import RUN_STATES, final_header
from blockviz.core.tags import tags_text
from blockviz.launch import runner
from blockviz.store import RunRecord, RunStore, checked
from blockviz.views.run_facts import read_divergence
from blockviz.views.run_findings import finding_json, plain_lines, read_findings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def open_existing(store: str | None) -> RunStore:
    """The store a command reads or steers: writable when it can be (to mark dead runs),
    else read-only; never created (a missing file, or a database without blockviz's
    tables, is an error naming where it looked), and a server that does not answer is
    said at once; a damaged file is reported as corrupt rather than read."""
    return checked(RunStore.open_readable(store, create=False, wait_for_server=False))


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def cli_runs(args: argparse.Namespace) -> int:
    """`python -m blockviz runs`: one line per run (id, name, status, step, val loss, device,
    tags, disk), then a warning when the store's checkpoints pass the warning size."""
    try:
        limit_mb = disk.warn_mb(args.ckpt_warn_mb)
    except disk.WarnSizeError as exc:
        print(f"blockviz runs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with open_existing(args.store or None) as store:
        store.reap_dead()  # a read-only store is listed as it is
        frame = store.runs_frame()
        where = store.where
        sizes = [disk.folder_bytes(store.run_dir(int(i))) for i in frame["id"]]
        warning = disk.over_warning(
            disk.checkpoint_bytes(store.runs_root), limit_mb, str(store.runs_root)
        )
    words = runner.shown_in(frame)  # as the pages word them: a queued run may be starting
    if args.json:
        records = json.loads(frame.to_json(orient="records"))
        for record, size in zip(records, sizes, strict=True):
            record["disk_bytes"] = size
        print(json.dumps(records, indent=2))
        if warning:
            print(warning, file=sys.stderr)
        return EXIT_OK
    if frame.empty:
        print(f"no runs yet in {where}; start one with `{CLI} train --preset baby-cpu`")
        return EXIT_OK
    header = ("id", "name", "status", "step", "val loss", "device", "tags", "disk")
    rows = [
        (
            str(row.id),
            str(row.name),
            words[int(row.id)],
            f"{_fmt(row.step)}/{_fmt(row.max_steps)}",
            _fmt(row.val_loss, ".4f"),
            str(row.device) if isinstance(row.device, str) and row.device else "-",
            str(row.tags) if isinstance(row.tags, str) and row.tags else "-",
            disk.size_text(size),
        )
        for row, size in zip(frame.itertuples(), sizes, strict=True)
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    if warning:
        print(f"\nwarning: {warning}")
    return EXIT_OK


def _config_summary(config: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not config:
        return []
    try:
        run_config = cfg.RunConfig.from_dict(config)
    except ConfigError:
        return [("config", json.dumps(config))]
    m, t, d = run_config.model, run_config.train, run_config.data
    norm = "no norm" if m.norm_position == "none" else f"{m.norm_position}-{m.norm_type}"
    sublayers = (
        "attention + ffn"
        if m.attention and m.ffn
        else ("attention only" if m.attention else "ffn only")
    )
    model = (
        f"{m.n_layer} layers x {m.n_head} heads, d_model {m.d_model}, ctx {m.block_size}, {norm}, "
        f"{sublayers}, {m.activation} x{m.ffn_mult}, residual {'on' if m.residual else 'off'}, "
        f"init {m.init}, dropout {m.dropout:g}"
    )
    # The instability fixes, only when on: most runs have none, and a line names what is there.
    if m.qk_norm and m.attention:
        model += f", qk-norm ({'rmsnorm' if m.norm_type == 'rmsnorm' else 'layernorm'})"
    if m.logit_softcap > 0:
        model += f", logit soft-cap {m.logit_softcap:g}"
    schedule = "constant" if t.lr_schedule == "constant" else f"{t.lr_schedule} to {t.min_lr:g}"
    train = (
        f"{t.max_steps} steps x batch {t.batch_size}, AdamW lr {t.lr:g} {schedule} after "
        f"{t.warmup_steps} warm-up steps, betas ({t.beta1:g}, {t.beta2:g}), wd {t.weight_decay:g}, "
        f"clip {t.grad_clip:g}, seed {t.seed}"
    )
    if t.z_loss > 0:
        train += f", z-loss {t.z_loss:g}"
    return [("model", model), ("train", train), ("data", f"{d.dataset} (val {d.val_fraction:g})")]


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def fork_line(run: RunRecord) -> str:
    """'fork of run 1 at step 100 (norm_position pre)', 'replay of run 1 from step 400:
    <what it found>'; a deleted parent is said so."""
    parent = f"run {run.parent_id}" if run.parent_id is not None else "a deleted run"
    info = run.fork_info or {}
    if run.fork_kind == "replay":
        found = info.get("sentence") or "not analysed (it did not train to its end)"
        return f"replay of {parent} from step {run.fork_step}: {found}"
    return f"fork of {parent} at step {run.fork_step} ({changes_text(info.get('changes') or {})})"


def cli_show(args: argparse.Namespace) -> int:
    """`python -m blockviz show RUN`: config summary, status, final metrics, last sample."""
    with open_existing(args.store or None) as store:
        store.reap_dead()
        run = store.get_run(args.run)
        samples = store.samples(run.id, limit=1)
        final = store.final_metrics([run.id])
        divergence = read_divergence(store, run) if run.status == "diverged" else None
        found = read_findings(store, run)
        run_dir = store.run_dir(run.id)
        used = {
            "disk_bytes": disk.folder_bytes(run_dir),
            "ckpt_bytes": disk.checkpoint_bytes(run_dir),
        }
        word = runner.shown_in(store.runs_frame())[int(run.id)]
    if run.status == "queued":  # starting or queued: which, and what it waits for
        word += f" ({RUN_STATES[word]})"
    last_sample = (
        None
        if samples.empty
        else {
            "step": int(samples.iloc[0]["step"]),
            "prompt": str(samples.iloc[0]["prompt"]),
            "text": str(samples.iloc[0]["text"]),
        }
    )
    metrics = {} if final.empty else json.loads(final.iloc[[0]].to_json(orient="records"))[0]
    if args.json:
        print(
            json.dumps(
                {
                    **run.to_dict(),
                    **used,
                    "final_metrics": metrics,
                    "last_sample": last_sample,
                    "divergence": None if divergence is None else asdict(divergence),
                    "headline": finding_json(found.headline),
                    "findings": [finding_json(f) for f in found.findings],
                },
                indent=2,
                default=str,
            )
        )
        return EXIT_OK
    lines: list[tuple[str, str]] = [
        ("run", f"{run.id} ({run.name})"),
        (
            "status",
            word + (f" at step {run.diverged_step}" if run.diverged_step is not None else ""),
        ),
        ("step", f"{_fmt(run.step)}/{_fmt(run.max_steps)}"),
        ("created", _when(run.created)),
        ("started", _when(run.started)),
        ("ended", _when(run.ended)),
        ("device", f"{run.device or '-'}, precision {run.precision or '-'}"),
        ("params", _fmt(run.n_params, ",")),
    ]
    if run.host:
        lines.append(("host", f"{run.host}, process {_fmt(run.pid)}"))
    if run.fork_step is not None:
        lines.append(("forked", fork_line(run)))
    dataset = run.dataset or {}
    if dataset:
        size = f"{dataset.get('n_chars', 0):,} chars, vocab {dataset.get('vocab_size')}"
        lines.append(("dataset", f"{dataset.get('name')}: {size}"))
        lines.append(("val loss on", evaluation.scored_on(dataset)))
    lines.append(("tags", tags_text(run.tags) or "-"))
    lines.append(
        (
            "disk",
            f"{disk.size_text(used['disk_bytes'])} "
            f"(checkpoints {disk.size_text(used['ckpt_bytes'])}) in {run_dir}",
        )
    )
    lines += _config_summary(run.config)
    shown = (
        "train_loss",
        "val_loss",
        "val_bpc",
        "val_ppl",
        "answer_acc",
        "answer_baseline",
        "time_s",
        "tokens_per_sec",
    )
    # Each under its table header (core.spec), so "train loss" and the mean tokens/s say
    # which train loss and which throughput they are, as on Compare and in the report.
    values = [
        f"{final_header(key)} = {_fmt(metrics.get(key), '.4g')}"
        for key in shown
        if metrics.get(key) is not None
    ]
    if values:
        lines.append(("metrics", ", ".join(values)))
    if run.error:
        lines.append(("error", str(run.error)))
    notes = run.notes or ""
    if notes:
        lines.append(("notes", notes))
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        # Notes keep their lines, each under the first.
        print(f"{label.ljust(width)}  " + value.replace("\n", "\n" + " " * (width + 2)))
    # The Live page's findings panel, in the same words (a diverged run's story included).
    print("\nfindings:")
    for line in plain_lines(found):
        print(f"  {line}")
    if last_sample is not None:
        print(f"\nlast sample (step {last_sample['step']}, prompt {last_sample['prompt']!r}):")
        print(last_sample["prompt"] + last_sample["text"])
    return EXIT_OK


def cli_stop(args: argparse.Namespace) -> int:
    """`python -m blockviz stop RUN`: `runner.stop_run`, its message printed; exit 1 if refused."""
    # Writable, not `open_existing`: a stop records `stopped` / `failed` when the run cannot.
    with RunStore(args.store or None, create=False, wait_for_server=False) as store:
        run = store.get_run(args.run)  # RUN may be a name; stop_run takes the id
        outcome = runner.stop_run(store, int(run.id))
    label = f"run {run.id} ({run.name})"
    print(f"{label}: {outcome.message}", file=sys.stdout if outcome.ok else sys.stderr)
    return EXIT_OK if outcome.ok else EXIT_FAILED
