"""The ops task measures what it claims: disjoint splits, whole questions, a trivial baseline."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blockviz.core import corpora
from blockviz.core.config_train import DataConfig
from blockviz.core.spec import final_header
from blockviz.core.vocab import CharVocab, DataError
from blockviz.store import RunStore
from blockviz.training.data import CharDataModule, answer_accuracy, baseline_predictions, batch_from

ROOT = Path(__file__).resolve().parents[2]


def _splits(dm: CharDataModule) -> tuple[list[str], list[str]]:
    """Complete lines of the training split and of the validation split."""
    text, n_train = dm.corpus.text, len(dm.train_ids)
    train_lines = text[:n_train].split("\n")[:-1]  # the last piece may be cut by the split
    val_lines = text[n_train:].split("\n")[1:-1]  # the first piece may start in training
    return train_lines, val_lines


@pytest.mark.parametrize(
    ("examples", "low", "high", "seed", "val_fraction"),
    [(20000, 2, 5, 0, 0.1), (3000, 2, 3, 1, 0.2), (500, 1, 2, 7, 0.5), (5000, 2, 9, 3, 0.05)],
)
def test_no_validation_line_occurs_in_training(examples, low, high, seed, val_fraction):
    data_cfg = DataConfig(
        dataset="ops",
        ops_examples=examples,
        ops_min_args=low,
        ops_max_args=high,
        ops_seed=seed,
        val_fraction=val_fraction,
    )
    dm = CharDataModule(data_cfg, block_size=32, batch_size=4, eval_iters=2)
    dm.setup()
    train_lines, val_lines = _splits(dm)
    assert val_lines and not set(val_lines) & set(train_lines)
    # Shuffled after the draw: the short lines are not all used up in training.
    shortest = [line for line in val_lines if line.count(",") == low - 1]
    assert shortest


def test_more_lines_than_exist_is_refused():
    assert corpora.ops_distinct_lines(1, 2) == 5 * 110
    assert len(corpora.ops_text(550, 1, 2, seed=0).splitlines()) == 550  # every one of them
    with pytest.raises(DataError, match="551 different lines were asked for, but only 550"):
        corpora.ops_text(551, 1, 2, seed=0)


def test_baseline_copies_first_and_last_and_guesses_the_most_frequent_answer():
    train = "max(1,9)=9\nmax(9,0)=9\nmax(2,3)=3\nsum(1,2)%10=3\nsum(4,4)%10=8\nmin(1,"
    table = corpora.ops_baseline_table(train)
    # max: 9 twice; sum: a tie between 3 and 8 goes to the smaller; min's only line is cut.
    assert table == {"max": "9", "sum": "3"}
    assert corpora.ops_baseline_answer("first(4,7,1)=", table) == "4"
    assert corpora.ops_baseline_answer("last(4,7,1)=", table) == "1"
    assert corpora.ops_baseline_answer("max(4,7)=", table) == "9"
    assert corpora.ops_baseline_answer("sum(4,7)%10=", table) == "3"
    assert corpora.ops_baseline_answer("min(4,7)=", table) is None  # never seen in training
    assert corpora.ops_baseline_answer("x(4,7)=", table) is None  # a cut question


def test_baseline_accuracy_on_a_window_equals_a_direct_count():
    vocab = CharVocab.from_text("max(0123456789,)=\nminfirstlastsum%")
    table = {"max": "9", "min": "0", "sum": "5"}
    # Scored: first (copy: right), max (guess 9: wrong), sum (guess 5: right), last (copy:
    # right). Not scored: the cut "7,1)=2" at the start and the cut answer at the end.
    window = "7,1)=2\nfirst(3,1)=3\nmax(1,2)=2\nsum(2,3)%10=5\nlast(0,4)=4\nmin(1,2)=1"
    ids = torch.tensor(vocab.encode(window))
    x, y = ids[None, :-1], ids[None, 1:]
    guesses = baseline_predictions(x, vocab, table)
    assert answer_accuracy(x, y, guesses, vocab) == (3, 4)
    assert answer_accuracy(x, y, y, vocab) == (4, 4)  # the model is scored on the same four


def test_the_logged_baseline_equals_a_direct_computation_on_the_validation_windows():
    dm = CharDataModule(DataConfig(dataset="ops", ops_examples=2000), 48, 8, eval_iters=4)
    dm.setup()
    train_lines, _ = _splits(dm)
    right = total = 0
    for starts in dm.val_starts:
        x, y = batch_from(dm.val_ids, starts, dm.block_size)
        for row in range(len(x)):
            window = dm.vocab.decode(x[row]) + dm.vocab.decode(y[row, -1:])
            for end, char in enumerate(window):
                if char != "\n" or end == 0:
                    continue
                line_start = window.rfind("\n", 0, end)
                equals = window.rfind("=", 0, end)
                if line_start < 0 or equals < line_start:
                    continue  # the question starts before the window
                total += 1
                op = window[line_start + 1 : window.index("(", line_start)]
                args = window[window.index("(", line_start) + 1 : window.index(")", line_start)]
                answer = window[equals + 1 : end]
                if op in ("first", "last"):
                    guess = args.split(",")[0 if op == "first" else -1]
                else:  # the op's most frequent answer in training, ties to the smaller
                    answers = [t.rsplit("=", 1)[1] for t in train_lines if t.startswith(op)]
                    guess = min(set(answers), key=lambda a: (-answers.count(a), a))
                right += guess == answer
    code = [0, 0]
    for starts in dm.val_starts:
        x, y = batch_from(dm.val_ids, starts, dm.block_size)
        correct, scored = answer_accuracy(
            x, y, baseline_predictions(x, dm.vocab, dm.answer_table), dm.vocab
        )
        code = [code[0] + correct, code[1] + scored]
    assert total > 50 and code == [right, total]


@pytest.mark.slow
def test_a_real_ops_run_records_the_baseline_in_scalars_and_final_metrics(tmp_path):
    store_path = tmp_path / "blockviz.db"
    command = [
        *(sys.executable, "-m", "blockviz", "train", "--preset", "tiny"),
        *("--dataset", "ops", "--ops_examples", "2000", "--max_steps", "6"),
        *("--eval_interval", "3", "--accelerator", "cpu", "--no_progress"),
        *("--store", str(store_path)),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with RunStore(store_path) as store:
        baseline = store.scalars(1, names="val/answer_baseline")
        accuracy = store.scalars(1, names="val/answer_acc")
        assert list(baseline["step"]) == list(accuracy["step"]) == [3, 6]
        assert 0.3 < baseline["value"].iloc[-1] < 0.8  # copying and guessing get some right
        final = store.get_run(1).final
        assert final["answer_baseline"] == pytest.approx(baseline["value"].iloc[-1])
        row = store.final_metrics([1]).iloc[0]
        assert row["answer_baseline"] == pytest.approx(final["answer_baseline"])
    shown = subprocess.run(
        [sys.executable, "-m", "blockviz", "show", "1", "--store", str(store_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # `show` prints each final metric under its one label (core.spec)
    assert final_header("answer_baseline") in shown.stdout, shown.stdout + shown.stderr
    json.dumps(final)  # a plain JSON object, as the store keeps it
