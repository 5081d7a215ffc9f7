"""Bad flags, config files and datasets: one line naming the problem, exit 2, no run.

Every case here must be refused before training starts (issue 10: a huge number, a
pathological JSON file or a FIFO gave a traceback, a hang or a run that died later).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from blockviz import cli
from blockviz.core.bounds import MAX_VOCAB
from blockviz.store import default_store_path


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit status and stderr of `blockviz ARGV`."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err and len(err) < 400, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["train", "--max_steps", "99999999999999999999"], "max_steps: 99999999999999999999"),
        (["train", "--seed", "9" * 5000], "seed: '999"),
        (["train", "--lr", "1e999"], "lr: inf"),
        (["train", "--lr", "nan"], "lr: nan"),
        (["train", "--n_layer", "10000"], "n_layer: 10000"),
        (["train", "--batch_size", "10000000"], "batch_size: 10000000"),
        (["train", "--vocab_size", "1000000"], "vocab_size: 1000000"),
        (["train", "--threads", "0"], "--threads: 0"),
        (["train", "--threads", "5000"], "--threads: 5000"),
        (["study", "run", "sublayers", "--threads", "0"], "--threads: 0"),
        (["params", "--n_layer", "100000000000000000000"], "n_layer: 100000000000000000000"),
        (["params", "--d_model", "9" * 5000], "d_model: '999"),
        (["data", "--ops_examples", "1000000000"], "ops_examples: 1000000000"),
        (["data", "--dataset", "ops", "--block_size", "100000"], "block_size: 100000"),
    ],
)
def test_out_of_range_flags_are_one_line(argv: list[str], needle: str, capsys) -> None:
    code, err = run_cli(argv, capsys)
    assert_one_line(code, err, needle, "is not allowed; must be")
    assert not default_store_path().exists()  # no run was created


CONFIG_FILES = {
    # name: (file content, what the one line must say)
    "deeply-nested": ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    "5000-digit-int": ('{"train": {"seed": ' + "9" * 5000 + "}}", "more than 4,300 digits"),
    "a-list": ("[1, 2, 3]", "must be a JSON object"),
    "a-section-list": ('{"model": [4]}', "model: [4] is not allowed"),
    "string-for-int": ('{"model": {"n_layer": "4"}}', "n_layer: '4' is not allowed"),
    "float-for-int": ('{"train": {"max_steps": 1e30}}', "max_steps: 1e+30 is not allowed"),
    "huge-int-for-float": ('{"train": {"lr": 1' + "0" * 400 + "}}", "lr: an integer of 401"),
    "unknown-field": ('{"model": {"n_layers": 3}}', "n_layers: 3 is not allowed"),
    "not-json": ("{nope", "is not valid JSON"),
    "not-utf8": (b"\xff\xfe{}", "is not UTF-8"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CONFIG_FILES))
def test_bad_config_files_are_one_line(case: str, tmp_path: Path, capsys) -> None:
    content, needle = CONFIG_FILES[case]
    path = tmp_path / "run.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    code, err = run_cli(["train", "--config", str(path)], capsys)
    assert_one_line(code, err, needle)
    assert not default_store_path().exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("command", "option"), [("train", "--config"), ("train", "--dataset"), ("data", "--dataset")]
)
def test_a_fifo_is_refused_at_once(command: str, option: str, tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    outcome: list[object] = []
    worker = threading.Thread(
        target=lambda: outcome.append(run_cli([command, option, str(fifo)], capsys)), daemon=True
    )
    worker.start()
    worker.join(60)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked reader go
        pytest.fail(f"blockviz {command} {option} FIFO still blocked after 60 s")
    code, err = outcome[0]
    assert_one_line(code, err, str(fifo), "is a named pipe (FIFO), not a regular file")
    assert not default_store_path().exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["train", "data"])
def test_too_many_symbols_are_refused_before_training(command: str, tmp_path: Path, capsys):
    path = tmp_path / "symbols.txt"
    path.write_text("".join(chr(0x4E00 + i) for i in range(MAX_VOCAB + 1)), encoding="utf-8")
    code, err = run_cli([command, "--dataset", str(path)], capsys)
    assert_one_line(code, err, str(path), f"{MAX_VOCAB + 1:,} distinct characters")
    assert not default_store_path().exists()


def test_a_bad_busy_timeout_in_the_environment_is_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setenv("BLOCKVIZ_BUSY_TIMEOUT_S", "soon")
    code, err = run_cli(["runs"], capsys)
    assert_one_line(code, err, "BLOCKVIZ_BUSY_TIMEOUT_S='soon' is not allowed")
    assert not default_store_path().exists()


def test_the_blockviz_console_script_runs_the_cli() -> None:
    """`pip install -e .` (what make does) puts a `blockviz` command beside the interpreter."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    script = shutil.which("blockviz", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("blockviz is not installed in this interpreter's environment (make test does)")
    result = subprocess.run(
        [script, "params", "--n_layer", "1", "--json"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert '"total"' in result.stdout


@pytest.mark.timeout(120)
def test_a_huge_sweep_is_refused_in_one_line_without_building_it(tmp_path: Path) -> None:
    """4 fields × 50 values once built every combination (2.7 GB, then a MemoryError)."""
    import resource
    import subprocess
    import sys

    def one_gib_of_memory() -> None:  # the refusal fits easily; the built grid does not
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    ranges = {"lr": "1e-4:1e-1", "min_lr": "1e-6:1e-5", "weight_decay": "1e-3:1e-1"}
    ranges["beta2"] = "0.9:0.999"
    flags = [part for name, low_high in ranges.items() for part in (f"--{name}", f"{low_high}:50")]
    store = tmp_path / "runs.db"
    command = [sys.executable, "-m", "blockviz", "study", "sweep", *flags, "--store", str(store)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, preexec_fn=one_gib_of_memory
    )
    assert_one_line(done.returncode, done.stderr, "6,250,000 runs, more than the 500")
    assert not store.exists()


def test_a_sweep_from_a_config_file_starts_from_that_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`study sweep --config FILE` once handed the parsed RunConfig to `from_json` again and
    ended in a TypeError traceback; it reads the file once (here a sweep too big to build,
    refused by its count, proves the file was read and the grid reached)."""
    from blockviz.core import config as cfg

    config_file = tmp_path / "base.json"
    config_file.write_text(cfg.preset("tiny").to_json())
    store = tmp_path / "runs.db"
    argv = ["study", "sweep", "--config", str(config_file), "--store", str(store)]
    code, err = run_cli([*argv, "--lr", "1e-4:1e-1:30", "--beta2", "0.9:0.999:30"], capsys)
    assert_one_line(code, err, "900 runs, more than the 500")
    assert not store.exists()
