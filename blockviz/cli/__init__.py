"""`python -m blockviz ...`: the command line.

Config flags are generated from the config dataclasses, one per field, named after the
field. Heavy modules (torch, Lightning) are imported inside the command that needs them, so
`--help`, `params` and `runs` start instantly. A bad flag or value prints one line naming
it and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from blockviz.cli import requests
from blockviz.core import config as cfg
from blockviz.core import disk, startup_trace
from blockviz.core.config_model import INITS
from blockviz.core.fields import ConfigError
from blockviz.core.flags import (
    EXIT_USAGE,
    ArgumentParser,
    UsageError,
    add_config_flags,
    flag_message,
    flag_metavar_and_help,
    replicas_arg,
    threads_arg,
)
from blockviz.core.presets import PRESETS


def _config_source_args(p: argparse.ArgumentParser) -> None:
    """Where a command's RunConfig starts: a JSON file or a preset (field flags go on top)."""
    p.add_argument("--config", help="RunConfig JSON file (flags below override it)")
    p.add_argument("--preset", choices=list(PRESETS), help="start from a preset")


# Each command registers its parser and a handler `fn(args) -> int`. Handlers import what
# they need inside so that one command's dependencies never slow another down. A training
# command's handler takes the request its flags are read into (`cli.requests`) instead.
Handler = Callable[[Any], int]
Reader = Callable[[argparse.Namespace], Any]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], str, Reader | None]] = {}


def command(name: str, help_text: str, handler_path: str, reader: Reader | None = None):
    """Register a command's argument builder; the handler is `module:function`, given
    `reader(args)` when the command has a reader, else the parsed flags."""

    def wrap(build: Callable[[argparse.ArgumentParser], None]):
        COMMANDS[name] = (help_text, build, handler_path, reader)
        return build

    return wrap


@command(
    "params", "parameter breakdown of a model config (no training)", "blockviz.cli.params:cli_main"
)
def _params_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--preset", choices=list(PRESETS), help="start from a preset")
    add_config_flags(p, ["model"])


@command("data", "statistics and a sample of a dataset", "blockviz.cli.data:cli_main")
def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sample_chars",
        type=int,
        default=300,
        metavar="INT",
        help="characters of sample text (default: 300)",
    )
    p.add_argument(
        "--block_size", type=int, default=None, metavar="INT", help="check the text is long enough"
    )
    add_config_flags(p, ["data"])


@command(
    "train",
    "train one run (headless), recording into the run store",
    "blockviz.training.train:main",
    requests.train_request,
)
def _train_args(p: argparse.ArgumentParser) -> None:
    _config_source_args(p)
    p.add_argument("--resume", metavar="RUN", help="continue RUN from its last checkpoint")
    p.add_argument("--run_id", type=int, help=argparse.SUPPRESS)  # pre-created by the runner
    _run_args(p, "run name (default: derived from the config)")
    p.add_argument(
        "--seeds",
        metavar="LIST",
        help="one run per seed (0,1,2 or 0-3), trained as replicas of one batched model",
    )
    replicas_arg(p)
    add_config_flags(p, list(cfg.SECTIONS))


@command(
    "fork",
    "a twin of a run from one of its kept checkpoints, changed only in the fields given",
    "blockviz.training.fork:main",
    requests.fork_request,
)
def _fork_args(p: argparse.ArgumentParser) -> None:
    _parent_args(p, "the run to fork", "--step", "N", "one of the run's kept checkpoint steps")
    _run_args(p)
    add_config_flags(p, list(cfg.SECTIONS))


@command(
    "replay",
    "re-run the steps before a loss spike or divergence with probes every step, and name "
    "the first statistic that left its healthy range",
    "blockviz.training.replay:main",
    requests.replay_request,
)
def _replay_args(p: argparse.ArgumentParser) -> None:
    _parent_args(
        p,
        "the run that spiked or diverged",
        "--around",
        "STEP",
        "the event's step (default: the run's divergence, else its largest loss spike)",
    )
    p.add_argument(
        "--after",
        type=int,
        default=10,
        metavar="INT",
        help="steps to replay past the event (default: 10)",
    )
    _run_args(p)


def _parent_args(
    p: argparse.ArgumentParser, what: str, flag: str, metavar: str, step_help: str
) -> None:
    """RUN and the step flag of a command that starts from a run's checkpoint."""
    p.add_argument("run", metavar="RUN", help=f"{what} (id or name)")
    p.add_argument(flag, type=int, required=flag == "--step", metavar=metavar, help=step_help)


def _run_args(
    p: argparse.ArgumentParser, name_help: str = "the new run's name (default: from its parent)"
) -> None:
    """The flags of a command that trains a run into a store (train, fork, replay)."""
    p.add_argument("--name", help=name_help)
    p.add_argument(
        "--store",
        help="run store: a file path or a postgresql:// URL "
        "(default $BLOCKVIZ_STORE or runs/blockviz.db)",
    )
    p.add_argument(
        "--max_running",
        type=int,
        default=0,
        metavar="INT",
        help="wait as 'queued' while this many runs are running (0: no limit; default: 0)",
    )
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    threads_arg(p)


@command(
    "init-grads",
    "per-layer gradient norm at initialization, Pre-LN vs Post-LN, by depth and init (no training)",
    "blockviz.training.init_grads:main",
    requests.init_grads_request,
)
def _init_grads_args(p: argparse.ArgumentParser) -> None:
    _config_source_args(p)
    p.add_argument(
        "--depths", nargs="+", type=int, default=[3, 6, 12, 24], help="n_layer values (3 6 12 24)"
    )
    p.add_argument("--inits", nargs="+", choices=INITS, default=list(INITS), help="inits (all)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 averaged (default 3)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: small matrices)"
    )
    # Only the fields the measurement uses: the model (n_layer, norm_position and init are
    # replaced by each variant), the dataset, and the batch size.
    add_config_flags(p, ["model", "data"])
    batch_metavar, batch_help = flag_metavar_and_help(cfg.FIELDS["batch_size"])
    p.add_argument("--batch_size", dest="cfg_batch_size", metavar=batch_metavar, help=batch_help)


@command("runs", "list the runs in a store", "blockviz.cli.runs:cli_runs")
def _runs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="run store: a file path or a postgresql:// URL")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--ckpt_warn_mb",
        metavar="MB",
        help="warn when the store's checkpoints take more than MB megabytes "
        f"(default ${disk.WARN_ENV}, else {disk.DEFAULT_WARN_MB}; 0: never)",
    )


@command("show", "summarise one run", "blockviz.cli.runs:cli_show")
def _show_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id or name")
    p.add_argument("--store", help="run store: a file path or a postgresql:// URL")
    p.add_argument("--json", action="store_true", help="print JSON")


@command("stop", "stop a running run (checkpoint, status 'stopped')", "blockviz.cli.runs:cli_stop")
def _stop_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id or name")
    p.add_argument("--store", help="run store: a file path or a postgresql:// URL")


@command(
    "export",
    "export charts, data and a report of runs, or runs as code",
    "blockviz.cli.export:cli_main",
)
def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="run ids or names")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--format",
        choices=["png", "svg", "html", "csv", "zip", "all", "code"],
        default="all",
        help="what to write; code: a self-contained PyTorch train_<name>.py per run (default: all)",
    )
    p.add_argument("--store", help="run store: a file path or a postgresql:// URL")


@command(
    "study",
    "studies: a question about the block answered by variants × seeds, with verdicts",
    "blockviz.cli.study:cli_main",
)
def _study_args(p: argparse.ArgumentParser) -> None:
    from blockviz.cli.study import build

    build(p)


@command(
    "ledger",
    "the claim ledger: every named claim with its verdicts, replication, machine and date",
    "blockviz.cli.ledger:cli_main",
)
def _ledger_args(p: argparse.ArgumentParser) -> None:
    from blockviz.cli.ledger import build_parser as build_ledger

    build_ledger(p)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    parser = ArgumentParser(
        prog="blockviz",
        description="Train small character-level transformers and see what the block does.",
        epilog="The dashboard: `make run` serves it at http://localhost:8501 (`make run "
        "PORT=8502` on another port). Each command's --help lists its arguments; examples "
        "and what each command prints: docs/cli-guide.md; what each config field does: "
        "docs/config-guide.md; every argument: docs/cli.md; the rest: README.md.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for name, (help_text, build, _, _) in COMMANDS.items():
        build(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, dispatch, turn expected errors into one line and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    _, _, handler_path, reader = COMMANDS[args.command]
    module_name, func_name = handler_path.split(":")
    import importlib

    startup_trace.mark("interpreter up, flags parsed")
    try:
        given = reader(args) if reader is not None else args
        handler: Handler = getattr(importlib.import_module(module_name), func_name)
        startup_trace.mark(f"{module_name} imported")
        return handler(given)
    except ConfigError as exc:
        print(f"blockviz {args.command}: error: {flag_message(exc, args)}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"blockviz {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        # Domain errors (DataError, StoreError, ...) subclass ValueError and carry a
        # message written for the user.
        if type(exc).__module__.startswith("blockviz"):
            print(f"blockviz {args.command}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        raise
