"""`python -m blockviz study run|sweep|launch|list|show|stop|resume|export|work`: studies
from a terminal.

`run` and `sweep` store the study, start its workers and, unless `--detach`, print its
progress until it ends (Ctrl-C stops the study, as it stops a `train` run); with
`--workers 0` they store it and start none, and `launch` starts its workers through
submitit (a SLURM job array, or N local processes). `show` prints the results table and
the claims with their verdicts. Torch-free except `work`, the worker process the others
start.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from blockviz import CLI
from blockviz.cli import study_launch
from blockviz.cli.runs import open_existing
from blockviz.core import config as cfg
from blockviz.core.flags import (
    UsageError,
    check_threads,
    config_overrides,
    read_config_file,
    replicas_arg,
    replicas_from_args,
    threads_arg,
)
from blockviz.core.presets import PRESETS
from blockviz.core.studies import builtins, define, sweeps
from blockviz.launch import study_estimate, study_runner
from blockviz.store import RunStore
from blockviz.views.commands import command_line

EXIT_OK = 0
POLL_S = 1.0


def build(p: argparse.ArgumentParser) -> None:
    """The `study` command's own subcommands."""
    sub = p.add_subparsers(dest="study_command", metavar="SUBCOMMAND", parser_class=type(p))
    sub.required = True
    store_help = (
        "run store: a file path or a postgresql:// URL (default $BLOCKVIZ_STORE or "
        "runs/blockviz.db)"
    )

    run = sub.add_parser("run", help="run a built-in study", description="run a built-in study")
    run.add_argument("study", choices=builtins.STUDY_KEYS, help="which study")
    _launch_args(run, store_help)

    sweep = sub.add_parser(
        "sweep",
        help="sweep config fields × seeds (--lr 1e-4:1e-1:7 --norm_position pre,post)",
        description="Sweep any config fields: give a field's values as a,b,c or as a log "
        "range low:high:n; a field given one value is fixed for every run.",
    )
    sweep.add_argument("--config", help="RunConfig JSON file the sweep starts from")
    sweep.add_argument("--preset", choices=list(PRESETS), help="preset the sweep starts from")
    _launch_args(sweep, store_help)
    group = sweep.add_argument_group("fields to sweep (VALUES: a,b,c or low:high:n)")
    for section, section_cls in cfg.SECTIONS.items():
        for name in cfg.field_types(section_cls):
            if name in ("seed",):
                continue
            group.add_argument(f"--{name}", dest=f"cfg_{name}", metavar="VALUES", help=section)

    listing = sub.add_parser("list", help="list the studies in a store")
    listing.add_argument("--store", help=store_help)
    listing.add_argument("--json", action="store_true", help="print JSON")

    study_launch.build(sub, store_help)

    for name, text in (
        ("show", "progress, results and verdicts of a study"),
        ("stop", "stop a study (running runs checkpoint, queued ones are skipped)"),
        ("resume", "continue a stopped study's unfinished runs from their checkpoints"),
        ("export", "a study's zip: table, charts, configs, claims and an HTML page"),
    ):
        one = sub.add_parser(name, help=text, description=text)
        one.add_argument("id", help="study id (see `study list`)")
        one.add_argument("--store", help=store_help)
        if name == "show":
            one.add_argument("--json", action="store_true", help="print JSON")
        if name == "resume":
            one.add_argument(
                "--workers",
                type=int,
                help="worker processes (default: slots; 0: queue the runs, start none)",
            )
            threads_arg(one)
            replicas_arg(one)
        if name == "export":
            one.add_argument("--out", required=True, help="output directory")

    work_help = (
        "one worker, in this process: train a stored study's queued runs until none is left "
        "(what `launch` starts; any other scheduler can run it)"
    )
    work = sub.add_parser("work", help=work_help, description=work_help)
    work.add_argument("study", help="study id (see `study list`)")
    work.add_argument(
        "--store", required=True, help="the study's run store: a file path or a postgresql:// URL"
    )
    work.add_argument(
        "--max_running",
        type=int,
        default=0,
        metavar="INT",
        help="wait while this many runs of the store are running (0: no limit; default: 0)",
    )
    threads_arg(work)
    replicas_arg(work)


def _launch_args(p: argparse.ArgumentParser, store_help: str) -> None:
    p.add_argument(
        "--size",
        choices=define.SIZES,
        default=None,
        help="quick (minutes on a laptop), standard or full (a GPU); default quick",
    )
    p.add_argument(
        "--seeds",
        default=None,
        metavar="SEEDS",
        help=f"the seeds every variant runs: {define.SEEDS_HELP}; seeds disjoint from an "
        "earlier study's replicate its verdicts (default: the size's count, a sweep's 1; "
        f"{define.GPU_SEEDS} on a GPU)",
    )
    p.add_argument("--name", help="study name (default: the study and its size)")
    p.add_argument("--store", help=store_help)
    p.add_argument(
        "--workers",
        type=int,
        help="worker processes (default: the run slots; 0: store the study and start none, "
        "for `study launch` or `study work`)",
    )
    threads_arg(p)
    replicas_arg(p)
    p.add_argument("--detach", action="store_true", help="start it and return at once")


def cli_main(args: argparse.Namespace) -> int:
    """Dispatch to the subcommand."""
    if args.study_command == "work":
        # By name, like `train`: the CLI itself never imports the training side.
        import importlib

        from blockviz.cli.requests import work_request

        request = work_request(args)
        return int(importlib.import_module("blockviz.training.study_worker").main(request))
    handlers = {
        "run": _run,
        "sweep": _sweep,
        "launch": study_launch.cli_main,
        "list": _list,
        "show": _show,
        "stop": _stop,
        "resume": _resume,
        "export": _export,
    }
    return handlers[args.study_command](args)


def _store(args: argparse.Namespace) -> RunStore:
    """The store for reading, its dead runs marked failed first, as `runs` and `show` do."""
    store = open_existing(args.store or None)
    try:
        store.reap_dead()  # a read-only store is read as it is
    except BaseException:
        store.close()
        raise
    return store


def _positive(name: str, value: int | None, least: int = 1) -> None:
    if value is not None and value < least:
        raise UsageError(f"--{name}: {value} is not allowed; must be at least {least}")


def _run(args: argparse.Namespace) -> int:
    _positive("workers", args.workers, least=0)
    study = builtins.builtin(args.study, args.size or "quick", args.seeds)
    return _launch_and_watch(args, study)


def _sweep(args: argparse.Namespace) -> int:
    _positive("workers", args.workers, least=0)
    base = cfg.RunConfig()
    if args.config:
        base = read_config_file(args.config)
    elif args.preset:
        base = cfg.preset(args.preset)
    grid: dict[str, list[Any]] = {}
    fixed: dict[str, Any] = {}
    for section, section_cls in cfg.SECTIONS.items():
        for name in cfg.field_types(section_cls):
            text = getattr(args, f"cfg_{name}", None)
            if text is None:
                continue
            if "," in text or text.count(":") == 2:
                grid[name] = sweeps.parse_values(name, text)
            else:
                fixed.update(
                    config_overrides(argparse.Namespace(**{f"cfg_{name}": text}), [section])
                )
    if not grid:
        raise UsageError(
            "name at least one field with two or more values, e.g. --lr 1e-4:1e-1:7 "
            "or --norm_position pre,post"
        )
    study = sweeps.sweep(grid, seeds=args.seeds, base=base, size=args.size, fixed=fixed)
    return _launch_and_watch(args, study)


def _launch_and_watch(args: argparse.Namespace, study: define.StudyDef) -> int:
    check_threads(args.threads)
    replica_limit = replicas_from_args(args)
    with RunStore(args.store or None) as store:
        if args.workers == 0:
            study_id = study_runner.launch(store, study, args.name, workers=0)
            print(
                f"blockviz: study {study_id} ({study.key}, {study.size}): {study.n_runs} runs "
                f"stored, no worker started; store {store.location.where}"
            )
            print(_no_worker_hint(store, study_id))
            return EXIT_OK
        workers = args.workers or study_runner.default_workers()
        pace = study_estimate.measured_pace(store)
        estimate = study_estimate.estimate_s(study, pace, workers, replica_limit)
        assumes = study_estimate.estimate_assumes(study, workers, threads=args.threads, pace=pace)
        study_id = study_runner.launch(
            store,
            study,
            args.name,
            workers=args.workers,
            threads=args.threads,
            replicas=replica_limit,
        )
        what = (
            f"{study.n_runs} runs ({len(study.variants)} variants × {len(study.seeds)} seeds) "
            f"on {workers} worker(s)"
            if study.trains
            else "gradients at initialisation, no training"
        )
        print(
            f"blockviz: study {study_id} ({study.key}, {study.size}): {what}; about "
            f"{_duration(estimate)} here ({assumes if study.trains else 'one process'}); "
            f"store {store.where}",
            flush=True,
        )
        note = None if args.seeds else define.seeds_note(study.base.get("accelerator", "auto"))
        if note and study.trains:
            print(f"blockviz: {note}", flush=True)
        if args.detach:
            print(
                f"blockviz: watch it with `{command_line(store, 'study', 'show', str(study_id))}`"
            )
            return EXIT_OK
        try:
            _watch(store, study_id)
        except KeyboardInterrupt:
            print(f"\nblockviz: stopping study {study_id}…", flush=True)
            print(f"blockviz: study {study_id} {study_runner.stop(store, study_id)}", flush=True)
            return EXIT_OK
        print(_verdict_lines(store, study_id), flush=True)
    return EXIT_OK


def _no_worker_hint(store: RunStore, study_id: int) -> str:
    launch = command_line(store, "study", "launch", str(study_id), "--slurm", "--workers", "N")
    work = command_line(store, "study", "work", str(study_id))
    return (
        f"blockviz: start its workers with `{launch}` (or `--local N`), or run `{work}` on "
        "any machine that reaches the store"
    )


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "an unknown time"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def _watch(store: RunStore, study_id: int) -> None:
    last = None
    began = time.monotonic()
    while True:
        now = study_runner.progress(store, study_id)
        line = f"{now.finished}/{now.total} done, {now.running} running, {now.queued} queued" + (
            f", {now.unfinished} stopped or failed" if now.unfinished else ""
        )
        if line != last:
            print(
                f"blockviz: study {study_id}: {line} ({time.monotonic() - began:.0f} s)", flush=True
            )
            last = line
        if now.status != "running" or now.unattended:
            break
        time.sleep(POLL_S)
    store.reap_dead()
    if study_runner.progress(store, study_id).unattended:
        print(
            f"blockviz: study {study_id} lost its workers; `study resume {study_id}` "
            "trains what is left",
            file=sys.stderr,
        )


def _verdict_lines(store: RunStore, study_id: int) -> str:
    """The results table and verdicts, as `show` prints them."""
    from blockviz.views.studies import text as study_text

    return study_text.summary_text(store, study_id)


def _list(args: argparse.Namespace) -> int:
    with _store(args) as store:
        frame = store.studies_frame()
        alive = {
            int(i): study_runner.status_label(store, int(i), str(status))
            for i, status in zip(frame["id"], frame["status"], strict=True)
        }
    if args.json:
        records = json.loads(frame.to_json(orient="records"))
        for record in records:
            record["status"] = alive[int(record["id"])]
        print(json.dumps(records, indent=2))
        return EXIT_OK
    if frame.empty:
        print(f"no studies yet; start one with `{CLI} study run lr-sensitivity`")
        return EXIT_OK
    header = ("id", "name", "study", "size", "status", "runs done")
    rows = [
        (
            str(r.id),
            str(r.name),
            str(r.key),
            str(r.size),
            alive[int(r.id)],
            f"{r.finished}/{r.runs}",
        )
        for r in frame.itertuples()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for line in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    with _store(args) as store:
        study = store.get_study(args.id)
        if args.json:
            from blockviz.views.studies import text as study_text

            print(json.dumps(study_text.summary_json(store, int(study.id)), indent=2))
            return EXIT_OK
        now = study_runner.progress(store, int(study.id))
        plan = define.plan_from_spec(study.spec)
        print(f"study {study.id}: {study.name} ({plan.key}, {plan.size}) — {now.label}")
        print(f"question: {plan.question}")
        print(
            f"runs: {now.finished}/{now.total} done, {now.running} running, "
            f"{now.queued} queued, {now.unfinished} stopped or failed"
        )
        print(_verdict_lines(store, int(study.id)))
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    with RunStore(args.store or None, create=False, wait_for_server=False) as store:
        study = store.get_study(args.id)
        print(f"blockviz: study {study.id} {study_runner.stop(store, int(study.id))}")
    return EXIT_OK


def _resume(args: argparse.Namespace) -> int:
    _positive("workers", args.workers, least=0)
    check_threads(args.threads)
    replica_limit = replicas_from_args(args)
    with RunStore(args.store or None, create=False, wait_for_server=False) as store:
        study = store.get_study(args.id)
        queued = study_runner.resume(
            store,
            int(study.id),
            workers=args.workers,
            threads=args.threads,
            replicas=replica_limit,
        )
        if queued.count:
            print(f"blockviz: study {study.id}: {queued.summary()}")
            for line in queued.lines():
                print(f"  {line}")
            if args.workers == 0:
                print(_no_worker_hint(store, int(study.id)))
        else:
            print(f"blockviz: study {study.id}: every run has finished; nothing to resume")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from blockviz.core.files import atomic_write
    from blockviz.views.studies import report as study_report

    out = Path(args.out).expanduser()
    with _store(args) as store:
        study = store.get_study(args.id)
        data = study_report.build_study_zip(store, int(study.id))
        name = study_report.zip_name(study)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / name, data)
    print(f"blockviz: wrote {out / name} ({len(data) / 1e6:.1f} MB)")
    return EXIT_OK
