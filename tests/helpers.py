"""Shared test helpers: plain functions and constants any test module may import (unlike
conftest's fixtures). Every helper more than one test module uses lives here; a test module
never imports another (tests/test_test_layout.py checks). Fake store data built from real
shapes is tests/fakes.py's; real tiny runs are tests/real_runs.py's and tests/finding_runs.py's.

Nothing here imports torch or streamlit at import time, so torch-free tests stay so.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import pandas as pd

from blockviz.core import config as cfg
from blockviz.core.findings import RunSeries
from blockviz.core.studies import builtins
from blockviz.core.studies.define import Claim, StudyDef, Variant
from blockviz.store import RunStore

if TYPE_CHECKING:
    import pytest
    from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent


TINY_RUN = {
    "n_layer": 2,
    "n_head": 2,
    "d_model": 16,
    "block_size": 16,
    "batch_size": 4,
    "max_steps": 6,
    "warmup_steps": 2,
    "eval_interval": 3,
    "eval_iters": 2,
    "probe_interval": 2,
    "sample_interval": 3,
    "accelerator": "cpu",
}


def tiny_config(**overrides: Any) -> cfg.RunConfig:
    """A validated 2-layer, d_model 16 run config that trains in well under a second."""
    return cfg.replace(cfg.RunConfig(), **{**TINY_RUN, **overrides}).validate()


FOX_TEXT = "the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs.\n" * 40


def tiny_datamodule(config: cfg.RunConfig, text: str = FOX_TEXT) -> tuple[Any, cfg.RunConfig]:
    """A set-up CharDataModule over `text` (one validation batch) and the config with its
    vocabulary size; the training side is imported here, so torch-free tests stay so."""
    from blockviz.core.corpora import Corpus
    from blockviz.training.data import CharDataModule

    dm = CharDataModule(
        config.data,
        config.model.block_size,
        config.train.batch_size,
        eval_iters=1,
        corpus=Corpus("fox", "test", text),
    )
    dm.setup()
    return dm, cfg.replace(config, vocab_size=dm.vocab.size)


# GFM's literal autolinks as Streamlit's Markdown finds them: in the text left after
# escapes are read (mdast-util-gfm-autolink-literal's patterns; JavaScript's \w is ASCII).
_AUTOLINKS = (
    re.compile(r"(https?://|www(?=\.))[-.\w]+", re.IGNORECASE | re.ASCII),
    re.compile(r"[-.\w+]+@[-\w]+(?:\.[-\w]+)+", re.ASCII),
)
WORD_JOINER = "\u2060"  # ui.plain's: invisible, so the reader never sees it


def _unescaped(markdown: str) -> str:
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


def shown(markdown: str) -> str:
    """Markdown source as the reader sees it: ui.plain's escapes and word joiners removed."""
    return _unescaped(markdown).replace(WORD_JOINER, "")


def autolinks(markdown: str) -> list[str]:
    """What in a Markdown source could become a link by itself (a bare URL or email)."""
    text = _unescaped(markdown)  # GFM looks for them once the escapes are read
    return [match.group() for pattern in _AUTOLINKS for match in pattern.finditer(text)]


# ------------------------------------------------------------------------------- AppTest


def texts(at: AppTest, kind: str) -> str:
    """What the elements of one kind (`markdown`, `caption`, ...) say, as the reader sees it."""
    return "\n".join(shown(str(e.value)) for e in getattr(at, kind))


def rerun_only(
    at: AppTest, fragment_ids: list[str], states: object = None, **flags: bool
) -> AppTest:
    """Rerun only these fragments, with these widget states, as a browser asks the server
    to (AppTest has no call for it). The tree then holds only what the fragments drew,
    unless they asked for a full rerun."""
    from streamlit.testing.v1 import local_script_runner

    plain_rerun = local_script_runner.RerunData
    with mock.patch.object(
        local_script_runner,
        "RerunData",
        lambda **kwargs: plain_rerun(**kwargs, fragment_id_queue=fragment_ids, **flags),
    ):
        at._run(widget_state=states)
    assert not at.exception, [e.value for e in at.exception]
    return at


def select_row(at: AppTest, run_id: int | None) -> AppTest:
    """Click run_id's row of the Runs table (None: click the selected row off) as a browser
    does: the selection goes to the server with the widget states and only the fragments
    rerun, so redrawing the actions below the table is the page's own job."""
    from blockviz.dashboard.runs_panel import TABLE_KEY

    if run_id is not None and selected_rows(at) == [run_id]:
        return at  # already selected (a click on it would clear the selection)
    table = at.dataframe(key=TABLE_KEY)
    rows = [] if run_id is None else [[int(i) for i in table.value["id"]].index(run_id)]
    states = at._tree.get_widget_states()
    selection = {"selection": {"rows": rows, "columns": [], "cells": []}}
    states.widgets.add(id=table.proto.id, string_value=json.dumps(selection))
    return rerun_only(at, list(at._fragment_storage._fragments), states)


def selected_rows(at: AppTest) -> list[int]:
    """The ids of the rows the table shows selected: the one the user clicked, or the one
    the page selected itself (which it sends to the browser)."""
    from blockviz.dashboard.runs_panel import TABLE_KEY

    table = at.dataframe(key=TABLE_KEY)
    ids = [int(i) for i in table.value["id"]]
    if table.proto.selection_state:
        rows = json.loads(table.proto.selection_state)["selection"]["rows"]
    else:
        rows = at.session_state[TABLE_KEY]["selection"]["rows"]
    return [ids[row] for row in rows]


def chart_specs(at: AppTest) -> dict[str, dict]:
    """Chart title -> its Vega-Lite spec as the page sent it."""
    found = {}
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        title = spec.get("title")
        found[str(title.get("text") if isinstance(title, dict) else title)] = spec
    return found


def fake_study(
    store: RunStore, key: str = "activation", scored: dict | None = None, seeds: str | None = None
) -> int:
    """A finished study whose runs carry constructed, neutral numbers (no worker ran);
    `scored`: the runs' evaluation record (None: recorded before the evaluation set);
    `seeds` as `study run --seeds` takes them (None: the size's)."""
    plan = builtins.builtin(key, "quick", seeds)
    runs = [
        {"variant": v.label, "seed": s, "config": c.to_json(), "max_steps": 300}
        for v, s, c in plan.grid()
    ]
    study_id, run_ids = store.create_study("fake", key, "quick", plan.to_spec(), runs)
    for index, run_id in enumerate(run_ids):
        loss = 2.0 + 0.01 * (index % 3)  # the same for every variant up to seed noise
        store.update_run(
            run_id,
            status="completed",
            ended=time.time(),
            step=300,
            n_params=1000,
            final={"val_loss": loss, "train_loss": loss, "time_s": 5.0},
            dataset={
                "unigram_nats": 3.0,
                "init_loss": 4.17,
                "vocab_size": 65,
                **({"evaluation": scored} if scored else {}),
            },
        )
    store.update_study(study_id, status="completed", ended=time.time())
    return study_id


# ---------------------------------------------------------------- hand-made chart frames


# Names and values carry no claim about any configuration (values differ per run and layer
# only so that marks can be told apart).
FRAME_RUNS = {1: "run-a", 2: "run-b"}
_FRAME_TAPS = ("resid_pre", "attn_out", "resid_post")


def scalars_frame(steps: int = 30, runs: dict[int, str] = FRAME_RUNS) -> pd.DataFrame:
    """train/loss and lr every step, val/loss every 10, for each run."""
    rows = []
    for run_id, name in runs.items():
        for step in range(steps):
            loss = 3.0 * math.exp(-step / 10) + 0.1 * run_id  # distinct curves, no ranking
            rows += [
                (run_id, name, step, "train/loss", loss),
                (run_id, name, step, "train/lr", 1e-3 * min(1.0, (step + 1) / 5)),
            ]
            if step % 10 == 0:
                rows.append((run_id, name, step, "val/loss", loss + 0.05))
    return pd.DataFrame(rows, columns=["run_id", "run", "step", "name", "value"])


def layer_frame(runs: dict[int, str] = FRAME_RUNS, steps=(0, 10, 20, 30), n_layer: int = 3):
    """Component, tap and head statistics for every run, layer and step."""
    rows = []
    for run_id, name in runs.items():
        for step in steps:
            for layer in range(n_layer):
                for component in ("attn", "ffn", "block"):
                    # the same hump for every run (middle layer highest): no depth trend
                    grad = (0.1 * (1 + (layer == 1)) + 0.05 * run_id) * (1 + step / 100)
                    rows += [
                        (run_id, name, step, layer, "component", component, "grad_norm", grad),
                        (run_id, name, step, layer, "component", component, "update_ratio", 1e-3),
                    ]
                for tap in _FRAME_TAPS:
                    rows.append((run_id, name, step, layer, "tap", tap, "rms", 1.0 + (layer % 2)))
                for head in ("0", "1"):
                    rows.append((run_id, name, step, layer, "head", head, "attn_entropy", 2.0))
    columns = ["run_id", "run", "step", "layer", "kind", "component", "stat", "value"]
    return pd.DataFrame(rows, columns=columns)


def hist_frame() -> pd.DataFrame:
    """Histogram rows of one run and tap over three steps."""
    rows = [
        (1, step, 0, "resid_post", b, -1 + 0.25 * b, -0.75 + 0.25 * b, [0, 3, 9, 3, 0, 1, 0, 0][b])
        for step in (0, 10, 20)
        for b in range(8)
    ]
    return pd.DataFrame(
        rows, columns=["run_id", "step", "layer", "tap", "bin", "lo", "hi", "count"]
    )


def attn_frame(size: int = 4) -> pd.DataFrame:
    """Causal attention maps of two heads over `size` positions."""
    text = "abcd"
    rows = [
        (1, 50, 0, head, q, k, text[q], text[k], 1 / (q + 1) if k <= q else 0.0)
        for head in range(2)
        for q in range(size)
        for k in range(size)
    ]
    columns = ["run_id", "step", "layer", "head", "query", "key", "query_char", "key_char"]
    return pd.DataFrame(rows, columns=[*columns, "weight"])


def params_components() -> pd.DataFrame:
    return pd.DataFrame(
        {"component": ["attn", "ffn", "norm"], "count": [100, 200, 10], "share": [0.3, 0.65, 0.05]}
    )


def params_layers() -> pd.DataFrame:
    return pd.DataFrame(
        {"layer": ["embed", "0", "0", "head"], "component": ["embed", "attn", "ffn", "head"]}
    ).assign(count=[10, 100, 200, 10])


def spec_dicts(node: Any) -> Iterator[dict[str, Any]]:
    """Every dict in a nested chart spec (Vega-Lite or compiled Vega), outermost first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from spec_dicts(value)
    elif isinstance(node, list):
        for item in node:
            yield from spec_dicts(item)


# ------------------------------------------------------------- constructed study results


# Neutral variant names and numbers chosen to hit each branch of each rule; they say
# nothing about what any configuration does.
NEUTRAL = StudyDef(
    key="t",
    title="t",
    question="q",
    claims=(),
    variants=(Variant("a", {}), Variant("b", {"ffn_mult": 2})),
    swept=(),
    baseline="a",
)


def frame(rows: list[tuple]) -> pd.DataFrame:
    """(variant, seed, outcome, val_loss, extra columns...) -> a results frame."""
    records = []
    for i, row in enumerate(rows):
        variant, seed, outcome, loss, *extra = row
        record = {
            "run_id": i + 1,
            "variant": variant,
            "seed": seed,
            "status": {"diverged": "diverged", "": "running"}.get(outcome, "completed"),
            "outcome": outcome,
            "diverged_step": math.nan,
            "val_loss": loss,
            "train_loss": loss,
            "n_params": 100.0,
            "time_s": 2.0,
            "unigram_nats": 3.0,
            "init_loss": 4.0,
        }
        record.update(extra[0] if extra else {})
        records.append(record)
    return pd.DataFrame(records)


def claim(rule: str, **args) -> Claim:
    """A claim that applies `rule` with `args`."""
    return Claim("a claim", "a source", rule, args)


# ----------------------------------------------------------- constructed findings series


# Each series sits just inside or just past one documented threshold; none says what any
# configuration does.
N_LAYER = 3
UNIGRAM = 3.0


def scalars(**series: dict[int, float]) -> pd.DataFrame:
    """name -> {step: value} as a scalars frame."""
    rows = [
        (step, name, value) for name, values in series.items() for step, value in values.items()
    ]
    return pd.DataFrame(rows, columns=["step", "name", "value"])


def layer_rows(kind: str, component: str, stat: str, table: dict[int, list[float]]) -> list[tuple]:
    """step -> one value per layer (0, 1, ...) as layer_stats rows."""
    return [
        (step, layer, kind, component, stat, value)
        for step, values in table.items()
        for layer, value in enumerate(values)
    ]


def head_rows(stat: str, table: dict[int, list[list[float]]]) -> list[tuple]:
    """step -> [layer][head] values as head rows."""
    return [
        (step, layer, "head", str(head), stat, value)
        for step, layers in table.items()
        for layer, heads in enumerate(layers)
        for head, value in enumerate(heads)
    ]


def layers_frame(*groups: list[tuple]) -> pd.DataFrame:
    """layer_rows and head_rows groups as one layer_stats frame (no run columns)."""
    rows = [row for group in groups for row in group]
    return pd.DataFrame(rows, columns=["step", "layer", "kind", "component", "stat", "value"])


def flat_loss(steps: int, value: float = 2.0) -> dict[int, float]:
    """A loss that stays at `value` for `steps` steps."""
    return dict.fromkeys(range(steps), value)


def series(
    scalar_frame: pd.DataFrame | None = None,
    layer_frame: pd.DataFrame | None = None,
    status: str = "completed",
    diverged_step: int | None = None,
    **config: object,
) -> RunSeries:
    """What the findings rules read of one run, N_LAYER layers deep; config overrides."""
    run_config = cfg.replace(cfg.RunConfig(), **{"n_layer": N_LAYER, **config})
    return RunSeries(
        status=status,
        diverged_step=diverged_step,
        config=run_config,
        unigram=UNIGRAM,
        init_loss=4.0,
        scalars=scalar_frame
        if scalar_frame is not None
        else scalars(**{"train/loss": flat_loss(10)}),
        layers=layer_frame if layer_frame is not None else layers_frame(),
    )


def probed_at(steps: tuple[int, ...]) -> RunSeries:
    """A 300-step run probed at `steps` whose values after step 0 would alarm every state
    rule: dead units 0 → 82%, attention logits 1.4 → 3,110, entropy 2 → 0.014, ..."""

    def per_layer(start: float, later: float) -> dict[int, list[float]]:
        return {step: [start if step == 0 else later] * N_LAYER for step in steps}

    def per_head(start: float, later: float) -> dict[int, list[list[float]]]:
        return {step: [[start if step == 0 else later] * 2] * N_LAYER for step in steps}

    grads = {step: [1.0, 1.0, 1.0] if step == 0 else [1e-6, 1.0, 1.0] for step in steps}
    frame = layers_frame(
        layer_rows("component", "block", "grad_norm", grads),
        layer_rows("component", "weights", "update_ratio", per_layer(3e-3, 0.5)),
        layer_rows("tap", "ffn_hidden", "dead_frac", per_layer(0.0, 0.82)),
        layer_rows("tap", "resid_post", "token_cos", per_layer(0.3, 0.999)),
        layer_rows("tap", "resid_post", "max_over_median", per_layer(5.0, 5e3)),
        layer_rows("tap", "resid_post", "max_abs", per_layer(3.0, 500.0)),
        layer_rows("tap", "resid_post", "rms", per_layer(1.4, 500.0)),
        head_rows("attn_entropy", per_head(2.0, 0.014)),
        head_rows("attn_logit_max_abs", per_head(1.4, 3110.0)),
    )
    loss = {step: 4.0 - 2.0 * step / 299 for step in range(300)}  # down to 2, well below H₁
    scalar_frame = scalars(
        **{
            "train/loss": loss,
            "val/loss": {100: 2.5, 200: 2.3, 300: 2.1},
            "train/lr": dict.fromkeys(range(300), 1e-3),
            "probe/logit_max_abs": {step: 10.0 if step == 0 else 500.0 for step in steps},
            "probe/log_z": dict.fromkeys(steps, 3.0),
        }
    )
    return series(scalar_frame, frame, lr=1e-3, max_steps=300, probe_interval=299)


# --------------------------------------------------------------- the CLI in subprocesses


def train_args(store: Path, corpus: Path, *flags: str) -> list[str]:
    """`blockviz train`'s arguments for the tiny preset on the small corpus; flags after it
    override. `cli.main(train_args(...))` trains in this process: no interpreter to start."""
    return [
        "train",
        *("--preset", "tiny", "--dataset", str(corpus), "--store", str(store)),
        "--no_progress",
        *flags,
    ]


def train_command(store: Path, corpus: Path, *flags: str) -> list[str]:
    """`train_args` as a command: `python -m blockviz train ...`, for `start`."""
    return [sys.executable, "-m", "blockviz", *train_args(store, corpus, *flags)]


def start(command: list[str]) -> subprocess.Popen:
    """Start a train command (one CPU thread, unbuffered); `finish` waits for it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str, str]:
    """Wait for `start`'s process: its exit code, stdout and stderr."""
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def study(store: Path | str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`python -m blockviz study ...` on the store `store` (a file or a URL), to its end."""
    command = [sys.executable, "-m", "blockviz", "study", *args, "--store", str(store)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@contextlib.contextmanager
def other_connection(store: Any) -> Iterator[Callable[..., Any]]:
    """A second connection to a store, as another process would have: yields an
    `execute(sql, params)` that takes the store's own `?` placeholders (SQLite or
    PostgreSQL) and commits each statement."""
    if store.is_server:
        import psycopg

        from blockviz.store.server import to_driver_sql

        with psycopg.connect(store.location.url, autocommit=True) as conn:
            yield lambda sql, params=(): conn.execute(to_driver_sql(sql), tuple(params))
        return
    conn = sqlite3.connect(store.path, isolation_level=None)
    try:
        yield conn.execute
    finally:
        conn.close()


def spawn(target: Callable[..., Any], args_list: list[tuple[Any, ...]]) -> list[Any]:
    """Start one spawned process per args tuple running `target` (a function of an
    importable test module); the started processes."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=target, args=args) for args in args_list]
    # An AppTest.from_function run earlier in this process leaves __main__ pointing at a
    # generated script; spawn would re-run it in each child. The targets live in
    # importable modules, so the children need no __main__ at all.
    main = sys.modules["__main__"]
    main_file = main.__dict__.pop("__file__", None)
    try:
        for child in children:
            child.start()
    finally:
        if main_file is not None:
            main.__file__ = main_file
    return children


# ------------------------------------------------- the fault suites (tests/test_faults*.py)

# Short evaluations and checkpoints every 10 steps, probes every 5, samples every 10.
FAULT_CADENCE = [
    *("--eval_interval", "10", "--probe_interval", "5", "--sample_interval", "10"),
    *("--eval_iters", "2"),
]


def fault_train(store: Path, corpus: Path, *flags: str) -> subprocess.Popen:
    return start(train_command(store, corpus, *FAULT_CADENCE, *flags))


def resume_args(store: Path, *flags: str) -> list[str]:
    """`blockviz train --resume 1`'s arguments; flags after it add to them."""
    return ["train", "--store", str(store), "--no_progress", "--resume", "1", *flags]


def fault_resume(store: Path, *flags: str) -> subprocess.Popen:
    return start([sys.executable, "-m", "blockviz", *resume_args(store, *flags)])


def train_here(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`cli.main(argv)` in this process, on one thread: `finish`'s (exit status, stdout,
    stderr) without a process to start, for a run or a resume whose process is not what a
    test looks at (no signal, no kill, no second writer)."""
    from blockviz import cli

    capsys.readouterr()  # what the test printed before is not this run's
    code = cli.main([*argv, "--threads", "1"])
    out, err = capsys.readouterr()
    return code, out, err


def logged_steps(store_path: Path, run_id: int, name: str) -> list[int]:
    with RunStore(store_path) as store:
        return store.scalars(run_id, names=name)["step"].tolist()


def wait_until(predicate, timeout: float = 90.0, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"condition not reached in {timeout} s")


def checkpoint_step(path: Path) -> int:
    import torch  # only the fault suites need it

    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def assert_continuous(store_path: Path, run_id: int, max_steps: int) -> None:
    """Every logged series holds each of its steps exactly once, with no gap."""
    assert logged_steps(store_path, run_id, "train/loss") == list(range(max_steps))
    assert logged_steps(store_path, run_id, "val/loss") == list(range(10, max_steps + 1, 10))
    with RunStore(store_path) as store:
        probed = store.layer_steps(run_id, kind="component", stat="grad_norm")
        # every 5 steps, and the last trained step (issue 12: the last step is probed)
        assert probed == sorted({*range(0, max_steps, 5), max_steps - 1})
        samples = store.samples(run_id)["step"].tolist()
        assert sorted(samples) == sorted(set(samples))  # one sample per step
        assert set(range(0, max_steps, 10)) <= set(samples)
        run = store.get_run(run_id)
    assert run.status == "completed" and run.step == max_steps
