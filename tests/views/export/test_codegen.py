"""Export as code: the exported train_<name>.py trains to blockviz's own losses.

The key test trains a grid of tiny configs twice, once with `python -m blockviz train`'s
entry point into a store and once with each exported script, and compares every logged
training and validation loss and learning rate; one script runs with other --max_steps,
--lr and --seed and must match blockviz's run of the config with those values. The other
tests check the script compiles and lints for every preset, imports nothing but the
standard library and torch, names itself safely, says what it does not reproduce and how
to use its flags, refuses a bad flag in one line, and is offered by the CLI and the pages.
"""

from __future__ import annotations

import ast
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from blockviz import cli
from blockviz.core import config as cfg
from blockviz.core.config import BOUNDS
from blockviz.core.config_train import DataConfig
from blockviz.core.presets import PRESETS
from blockviz.dashboard import code_download
from blockviz.store import RunStore
from blockviz.views.export import codegen
from tests import fakes
from tests.real_runs import TRAIN_ALL

ROOT = Path(__file__).resolve().parents[3]
RUFF = Path(sys.executable).with_name("ruff")

# Tiny runs with evaluations inside and at the end; each config below flips toggles on it.
BASE = {
    "n_layer": 2,
    "n_head": 2,
    "d_model": 16,
    "block_size": 16,
    "batch_size": 4,
    "max_steps": 10,
    "warmup_steps": 3,
    "eval_interval": 4,
    "eval_iters": 2,
    "probe_interval": 100,
    "sample_interval": 100,
    "accelerator": "cpu",
}
# These configs cover every toggle: each norm position and type, the final norm auto / on /
# off, residual on / off and scaled, attention-only and FFN-only, relu, silu and swiglu, bias
# off, tied weights, each init, dropout, each schedule with and without warm-up, clipping
# on / off, weight decay off, other betas, seed and split, averaged log lines, qk_norm as
# LayerNorm (with and without bias, the latter under batchnorm) and as RMSNorm, the logit
# soft-cap and the z-loss.
CONFIGS: dict[str, dict[str, object]] = {
    "pre-attention-only": {"ffn": False, "dropout": 0.1, "residual_scale": 2.0},
    "post": {
        **{"norm_position": "post", "activation": "relu", "lr_schedule": "linear"},
        **{"final_norm": True, "tie_weights": True, "init": "gpt2", "log_interval": 3},
        **{"qk_norm": True, "logit_softcap": 30.0},
    },
    "none-ffn-only": {
        **{"norm_position": "none", "residual": False, "residual_scale": 0.5},
        **{"lr_schedule": "constant", "warmup_steps": 0, "grad_clip": 0.0, "weight_decay": 0.0},
        **{"attention": False, "dropout": 0.2, "activation": "silu", "block_size": 8},
        **{"batch_size": 3, "seed": 7, "val_fraction": 0.2, "beta1": 0.8, "beta2": 0.95},
        **{"lr": 3e-3, "min_lr": 0.0},
    },
    "rmsnorm": {
        **{"norm_type": "rmsnorm", "activation": "swiglu", "bias": False, "init": "xavier"},
        **{"final_norm": False, "n_layer": 3, "n_head": 4, "ffn_mult": 2},
        **{"qk_norm": True, "z_loss": 1e-4},
    },
    # BatchNorm: batch statistics in training, running statistics in eval, both sides.
    "batchnorm": {
        **{"norm_type": "batchnorm", "norm_position": "post", "bias": False, "qk_norm": True},
        # At the papers' 30 and 1e-4 (post, rmsnorm) the cap and the z-loss move these tiny
        # runs' losses by less than the 1e-5 compared; here a script without them fails.
        **{"logit_softcap": 2.0, "z_loss": 0.05},
    },
}
STANDALONE = "pre-attention-only"  # its own process; the others share one (one torch import)
# One script run with flags: blockviz trains the config with the same values. "post" decays
# linearly, so a script whose schedule ignored the new --max_steps would print other lrs.
FLAGGED = ("post", {"max_steps": 7, "lr": 2e-3, "seed": 11})

# Runs each exported script as __main__ in one process, and proves none imported blockviz.
_RUN_SCRIPTS = """
import contextlib, io, json, runpy, sys
outputs = {}
for script, *flags in json.loads(sys.argv[1]):
    sys.argv = [script, *flags]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        runpy.run_path(script, run_name="__main__")
    outputs[script] = out.getvalue()
    assert not [m for m in sys.modules if m.split(".")[0] == "blockviz"], "imported blockviz"
print(json.dumps(outputs))
"""
LOSS_LINE = re.compile(r"^step\s+(\d+)\s+(train|val) loss (\S+)", re.MULTILINE)
LR_LINE = re.compile(r"^step\s+(\d+)\s+train loss \S+\s+lr (\S+)", re.MULTILINE)


def tiny(**overrides: object) -> cfg.RunConfig:
    return cfg.replace(cfg.RunConfig(), **{**BASE, **overrides}).validate()


def env() -> dict[str, str]:
    # One thread each: the three processes below share a small machine.
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-3000:]
    return out.decode()


def script_losses(output: str) -> dict[tuple[str, int], float]:
    """{("train" | "val", step): loss} from a script's printed lines."""
    return {(kind, int(step)): float(value) for step, kind, value in LOSS_LINE.findall(output)}


def script_lrs(output: str) -> dict[int, float]:
    """{step: lr} from a script's printed training lines (four significant digits)."""
    return {int(step): float(value) for step, value in LR_LINE.findall(output)}


def store_losses(store: RunStore, name: str) -> dict[tuple[str, int], float]:
    frame = store.scalars(store.resolve(name), ["train/loss", "val/loss"])
    return {(row.name.split("/")[0], int(row.step)): float(row.value) for row in frame.itertuples()}


def store_lrs(store: RunStore, name: str) -> dict[int, float]:
    frame = store.scalars(store.resolve(name), ["train/lr"])
    return {int(row.step): float(row.value) for row in frame.itertuples()}


@pytest.mark.slow
def test_exported_scripts_train_to_blockviz_losses(tmp_path: Path) -> None:
    text = tmp_path / fakes.CORPUS_NAME
    text.write_text(fakes.CORPUS, encoding="utf-8")
    store_path = tmp_path / "runs.db"
    flags, scripts, argv = [], {}, {}
    data = {"dataset": str(text)}
    # label -> (the config blockviz trains, the config the script is exported from, its flags)
    runs = {label: (tiny(**data, **o), tiny(**data, **o), []) for label, o in CONFIGS.items()}
    base, flag_values = FLAGGED
    flagged_label = f"{base}-flagged"
    runs[flagged_label] = (
        tiny(**data, **{**CONFIGS[base], **flag_values}),
        tiny(**data, **CONFIGS[base]),
        [item for name, value in flag_values.items() for item in (f"--{name}", str(value))],
    )
    for label, (trained, exported, extra) in runs.items():
        config_path = tmp_path / f"{label}.json"
        config_path.write_text(trained.to_json(), encoding="utf-8")
        where = ("--store", str(store_path), "--name", label, "--no_progress")
        flags.append(["--config", str(config_path), *where])
        scripts[label] = tmp_path / codegen.script_filename(label)
        scripts[label].write_text(codegen.script_text(exported, label), encoding="utf-8")
        argv[label] = [str(scripts[label]), "--data", str(text), *extra]
    shared = [argv[label] for label in runs if label != STANDALONE]
    procs = {
        "blockviz": start(["-c", TRAIN_ALL, json.dumps(flags)]),
        "standalone": start(argv[STANDALONE]),
        "shared": start(["-c", _RUN_SCRIPTS, json.dumps(shared)]),
    }
    outputs = {name: finish(proc) for name, proc in procs.items()}
    printed = json.loads(outputs["shared"])
    printed[str(scripts[STANDALONE])] = outputs["standalone"]
    store = RunStore(str(store_path), readonly=True)
    try:
        for label in runs:
            expected = store_losses(store, label)
            got = script_losses(printed[str(scripts[label])])
            assert {k for k in expected if k[0] == "val"}, label  # evaluations were logged
            assert got.keys() == expected.keys(), (label, sorted(got), sorted(expected))
            for key, value in expected.items():
                assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (label, key)
            lrs = script_lrs(printed[str(scripts[label])])
            assert lrs == pytest.approx(store_lrs(store, label), rel=1e-3), label
    finally:
        store.close()
    # The flags changed the run: steps 0-6 and a final evaluation at 7, another first loss.
    flagged = script_losses(printed[str(scripts[flagged_label])])
    assert max(step for kind, step in flagged if kind == "train") == flag_values["max_steps"] - 1
    assert ("val", flag_values["max_steps"]) in flagged
    plain = script_losses(printed[str(scripts[base])])
    assert flagged["train", 0] != pytest.approx(plain["train", 0], rel=1e-3)  # another seed


def imported_roots(source: str) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    return roots


def test_every_preset_exports_a_script_that_compiles_lints_and_imports_only_torch(
    tmp_path: Path,
) -> None:
    for name in PRESETS:
        source = codegen.script_text(cfg.preset(name), name)
        (tmp_path / codegen.script_filename(name)).write_text(source, encoding="utf-8")
        compile(source, name, "exec")
        outside = {r for r in imported_roots(source) if r not in sys.stdlib_module_names}
        assert outside == {"torch"}, (name, outside)
    rules = ["--select", "E,F,W,I,B,UP,SIM,RUF", "--line-length", "100"]
    for command in (["check", *rules], ["format", "--check", "--line-length", "100"]):
        done = subprocess.run(
            [str(RUFF), *command, "--isolated", str(tmp_path)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr


def constants(source: str) -> dict[str, object]:
    """The upper-case constants the script assigns at the top level."""
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                try:
                    found[name] = ast.literal_eval(node.value)
                except ValueError:
                    continue
    return found


def test_script_constants_are_the_configs_values() -> None:
    config = tiny(**CONFIGS["rmsnorm"], dataset="/somewhere/my text.txt")
    found = constants(codegen.script_text(config, "x"))
    for values in config.to_dict().values():
        for name, value in values.items():
            if name.upper() in found and name != "dataset":
                assert found[name.upper()] == value, name
    assert found["DATASET"] == "my text.txt"  # the file's name, not another machine's path
    assert {"N_LAYER", "NORM_POSITION", "INIT", "LR_SCHEDULE", "GRAD_CLIP"} <= found.keys()
    # The flags accept what blockviz would train: its bounds, not the script's own.
    for name in ("max_steps", "lr", "seed"):
        assert found[f"{name.upper()}_LIMIT"] == BOUNDS[name].high, name


@pytest.mark.parametrize(
    "name", ['../../etc/x"""; import os', "a\\b/c d!", "  ", "名前 run", "x" * 300]
)
def test_hostile_names_and_paths_give_a_safe_filename_and_valid_script(name: str) -> None:
    filename = codegen.script_filename(name)
    assert re.fullmatch(r"train_[a-z0-9._-]+\.py", filename), filename
    assert len(filename) < 120
    config = tiny(dataset=f'/tmp/{name}"""\\.txt')
    source = codegen.script_text(config, name)
    compile(source, filename, "exec")
    assert '"""' not in ast.get_docstring(ast.parse(source))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"dataset": "ops"}, "synthetic ops task"),
        ({"dataset": "pycode"}, "pycode corpus"),
        ({"devices": 2, "strategy": "ddp"}, "one device"),
        ({"logger": "csv"}, "csv logs"),
    ],
)
def test_header_says_what_is_not_reproduced(overrides: dict, words: str) -> None:
    doc = ast.get_docstring(ast.parse(codegen.script_text(tiny(**overrides), "x")))
    assert words in " ".join(doc.split())
    plain = ast.get_docstring(ast.parse(codegen.script_text(tiny(dataset="pydocs"), "x")))
    assert words not in " ".join(plain.split())


def test_header_says_the_printed_loss_leaves_the_z_loss_out() -> None:
    with_z = ast.get_docstring(ast.parse(codegen.script_text(tiny(z_loss=1e-4), "x")))
    assert "the Z_LOSS term is added only to what is trained on" in " ".join(with_z.split())
    without = ast.get_docstring(ast.parse(codegen.script_text(tiny(), "x")))
    assert "Z_LOSS" not in without


# ---------------------------------------------------------------------------- flags


def script_module(tmp_path: Path, config: cfg.RunConfig) -> dict[str, Any]:
    """The exported script loaded as a module (not __main__): its functions, nothing run."""
    path = tmp_path / codegen.script_filename("x")
    path.write_text(codegen.script_text(config, "x"), encoding="utf-8")
    return runpy.run_path(str(path), run_name="exported_script")


def test_help_lists_every_flag_with_the_runs_value(tmp_path: Path, capsys) -> None:
    config = tiny(max_steps=37, lr=0.0042, seed=99, accelerator="cpu", dataset="/a/fox.txt")
    with pytest.raises(SystemExit) as done:
        script_module(tmp_path, config)["main"](["--help"])
    assert done.value.code == 0
    # "  --max_steps MAX_STEPS  steps to train ... (default: 37)", one entry per option
    entries = re.split(r"\n  (?=-)", capsys.readouterr().out.split("options:")[1])
    defaults = {entry.split()[0]: " ".join(entry.split()) for entry in entries if entry.strip()}
    expected = {"--data": "fox.txt", "--max_steps": "37", "--lr": "0.0042", "--seed": "99"}
    for flag, value in {**expected, "--device": "cpu"}.items():
        assert defaults[flag].endswith(f"(default: {value})"), defaults[flag]


@pytest.mark.parametrize(
    ("flags", "overrides", "words"),
    [
        (["--max_steps", "0"], {}, "--max_steps: 0 is not allowed"),
        (["--max_steps", "2"], {}, "WARMUP_STEPS"),  # the 3 warm-up steps would not fit
        (["--max_steps", "1e3"], {}, "--max_steps: '1e3' is not allowed"),
        (["--lr", "-1"], {}, "--lr: -1 is not allowed"),
        (["--lr", "nan"], {}, "--lr: nan is not allowed"),
        (["--lr", "5e-5"], {}, "MIN_LR"),  # below where the decay ends
        (["--seed", "-1"], {}, "--seed: -1 is not allowed"),
        (["--seed", str(2**32)], {}, "--seed: 4294967296 is not allowed"),
        (["--device", "tpu"], {}, "--device: 'tpu' is not allowed"),
        (["--device", "cuda"], {}, "--device: cuda is not available here"),
        ([], {"accelerator": "gpu"}, "--device: gpu is not available here"),  # the default
        (["--data", "missing.txt"], {}, "--data: 'missing.txt' is not a file"),
        (["--data", "latin1.txt"], {}, "--data: 'latin1.txt' is not UTF-8 text"),
        (["--data", "short.txt"], {}, "--data: 'short.txt' is too short"),
        (["--lr"], {}, "--lr: expected one argument"),
        (["--steps", "3"], {}, "unrecognized arguments: --steps 3"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, flags, overrides, words
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fox.txt").write_text(fakes.CORPUS, encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 100)
    (tmp_path / "short.txt").write_text("too short", encoding="utf-8")
    main = script_module(tmp_path, tiny(**{"accelerator": "cpu", **overrides}))["main"]
    with pytest.raises(SystemExit) as done:
        main(["--data", "fox.txt", *flags])
    out, err = capsys.readouterr()
    assert done.value.code == 2 and out == ""
    assert len(err.splitlines()) == 1 and ": error: " in err, err
    assert words in err, err


@pytest.mark.slow
def test_a_bad_flag_from_the_shell_exits_2_without_a_traceback(tmp_path: Path) -> None:
    script = tmp_path / "train_x.py"
    script.write_text(codegen.script_text(tiny(), "x"), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, script.name, "--max_steps", "0"],
        cwd=tmp_path,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("train_x.py: error: argument --max_steps: 0 is not allowed")
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_header_says_how_to_use_the_flags(schedule: str) -> None:
    config = tiny(lr_schedule=schedule, max_steps=300, warmup_steps=20)
    doc = " ".join(ast.get_docstring(ast.parse(codegen.script_text(config, "x"))).split())
    assert "python train_x.py --data input.txt --max_steps 600 --device cuda" in doc
    for flag in ("--data", "--max_steps", "--lr", "--seed", "--device", "--help"):
        assert flag in doc, flag
    # What a new --max_steps does to the schedule, true for this one.
    if schedule == "constant":
        assert "decay" not in doc
    else:
        assert f"the {schedule} decay reaches MIN_LR at the last step" in doc
    assert "the WARMUP_STEPS warm-up steps are kept" in doc


# ---------------------------------------------------------------------------- CLI


def test_cli_export_code_writes_one_script_per_run(tmp_path: Path, capsys) -> None:
    store_path = tmp_path / "runs.db"
    store = RunStore(str(store_path))
    first = fakes.add_run(store, fakes.fake_config(norm_position="post"), name="post run")
    second = fakes.add_run(store, fakes.fake_config(n_layer=3), name="Post run", index=1)
    store.close()
    out = tmp_path / "out"
    where = ("--out", str(out), "--store", str(store_path))
    code = cli.main(["export", str(first), "Post run", "--format", "code", *where])
    assert code == 0
    files = sorted(out.iterdir())
    # The two names sanitise to one file name: the second gets its run id.
    assert [f.name for f in files] == ["train_post-run-2.py", "train_post-run.py"]
    found = [constants(f.read_text(encoding="utf-8")) for f in files]
    assert found[1]["NORM_POSITION"] == "post" and found[0]["N_LAYER"] == 3
    assert str(second) in files[0].name
    assert f"{len(files)} files" in capsys.readouterr().out


def test_cli_export_code_errors_are_one_line(tmp_path: Path, capsys) -> None:
    store_path = tmp_path / "runs.db"
    RunStore(str(store_path)).close()
    where = ("--out", str(tmp_path / "o"), "--store", str(store_path))
    code = cli.main(["export", "nope", "--format", "code", *where])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "nope" in err, err


# ---------------------------------------------------------------------------- pages


@pytest.fixture
def spied(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, object]]:
    """key -> (file name, data) of every "Export as code" button drawn."""
    drawn: dict[str, tuple[str, object]] = {}
    original = code_download.st.download_button

    def spy(label: str, data: object, file_name: str | None = None, **kwargs: object) -> bool:
        if label == code_download.LABEL:
            drawn[str(kwargs.get("key"))] = (str(file_name), data)
        return original(label, data, file_name=file_name, **kwargs)

    monkeypatch.setattr(code_download.st, "download_button", spy)
    return drawn


def built_script(drawn: tuple[str, object]) -> str:
    file_name, data = drawn
    assert callable(data), "the script is written on click, not on every refresh"
    source = data()
    compile(source, file_name, "exec")
    assert file_name.startswith("train_") and file_name.endswith(".py")
    return source


def test_train_page_exports_the_sidebar_config(spied) -> None:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30).run()
    assert not at.exception
    assert code_download.LABEL in [b.label for b in at.get("download_button")]
    assert constants(built_script(spied["train.code"]))["N_LAYER"] == cfg.RunConfig().model.n_layer


def test_runs_and_live_pages_export_the_shown_run(spied) -> None:
    store = RunStore(os.environ["BLOCKVIZ_STORE"])
    run_id = fakes.add_run(store, fakes.fake_config(n_layer=3, init="xavier"), name="xav")
    store.close()
    runs = AppTest.from_file(str(ROOT / "pages" / "runs.py"), default_timeout=30).run()
    assert not runs.exception
    live = AppTest.from_file(str(ROOT / "pages" / "live.py"), default_timeout=30)
    live.session_state["run_id"] = run_id
    live.run()
    assert not live.exception
    for key in ("runs.code", "live.code"):
        found = constants(built_script(spied[key]))
        assert (found["N_LAYER"], found["INIT"]) == (3, "xavier"), key
        assert spied[key][0] == "train_xav.py"


def script_function(source: str, name: str) -> object:
    """One top-level function of a script, defined without running the script (no torch)."""
    import codecs
    import urllib.request

    tree = ast.parse(source)
    wanted = [n for n in tree.body if getattr(n, "name", None) == name]
    namespace = {"codecs": codecs, "Path": Path, "sys": sys, "urllib": urllib}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "script", "exec"), namespace)
    return namespace[name]


def test_script_reads_text_as_blockviz_does(tmp_path: Path) -> None:
    from blockviz.core.corpora import load_corpus

    read_text = script_function(codegen.script_text(tiny(), "x"), "read_text")
    assert read_text("pydocs") == load_corpus(DataConfig(dataset="pydocs")).text
    messy = tmp_path / "messy.txt"
    messy.write_bytes(b"\xef\xbb\xbfline one\r\nline two \xc3\xa9\r\n\rend")
    assert read_text(str(messy)) == load_corpus(DataConfig(dataset=str(messy))).text


def test_a_field_the_script_does_not_build_is_named_when_the_run_sets_it(monkeypatch) -> None:
    """A new toggle declared in the registry without `code`: the export says the script
    leaves it out, instead of silently training another model."""
    monkeypatch.setattr(codegen, "_UNBUILT", (cfg.FIELDS["qk_norm"],))
    doc = " ".join(
        ast.get_docstring(ast.parse(codegen.script_text(tiny(qk_norm=True), "x"))).split()
    )
    assert "The run set qk_norm to True, which this script does not build" in doc
    plain = ast.get_docstring(ast.parse(codegen.script_text(tiny(), "x")))
    assert "qk_norm" not in plain
