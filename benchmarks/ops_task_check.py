"""Does the `ops` task measure what it claims? Overlap, cut questions, the trivial baseline.

    .venv/bin/python benchmarks/ops_task_check.py [--seed 1337] [--ops-seed 0]
        [--examples 20000] [--batch-size 12]

Builds the validation data exactly as a run does (default config, dataset `ops`) and
reports, with its own loops (not the code under test):

- overlap: the share of complete validation lines that occur as a line of the training
  split, overall and by number of arguments;
- cut questions: the share of the answers that `answer_accuracy` scores whose line starts
  before the window (the model never saw the whole question);
- the trivial baseline: copy the argument for first/last, otherwise the op's most frequent
  answer in the training split; its accuracy on all complete validation lines, on the
  answers the code scores, and what the run logs (`val/answer_baseline`).

Not a test: numbers for the README and issue 12.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blockviz.core import config as cfg
from blockviz.core.config_train import DataConfig, TrainConfig
from blockviz.training.data import (
    CharDataModule,
    answer_accuracy,
    baseline_predictions,
    batch_from,
)

LINE = re.compile(r"^(\w+)\(([\d,]*)\)(%10)?=(\d+)$")


def most_frequent_answers(lines: list[str]) -> dict[str, str]:
    """Per op, the answer most often seen among `lines` (ties: the smallest)."""
    counts: dict[str, Counter[str]] = {}
    for line in lines:
        match = LINE.match(line)
        if match:
            counts.setdefault(match.group(1), Counter())[match.group(4)] += 1
    return {op: min(c, key=lambda a: (-c[a], a)) for op, c in counts.items()}


def baseline(question: str, table: dict[str, str]) -> str | None:
    """The trivial guess for a question such as `max(3,9)=`: None when it does not parse."""
    match = re.match(r"^(\w+)\(([\d,]*)\)(%10)?=$", question)
    if not match:
        return None
    op, args = match.group(1), match.group(2).split(",")
    if op == "first":
        return args[0]
    if op == "last":
        return args[-1]
    return table.get(op)


def window_answers(window: str) -> list[tuple[bool, str, str]]:
    """(question starts in the window, question, answer) of each answer wholly inside.

    `window` is the block_size + 1 characters of one validation window: the inputs and the
    last target. An answer follows a '=' among the inputs and ends at the next newline.
    """
    found = []
    for i, char in enumerate(window[:-1]):
        if char != "=":
            continue
        end = window.find("\n", i + 1)
        if end < 0 or "=" in window[i + 1 : end]:
            continue  # cut by the window's end, or not the line's last '='
        line_start = window.rfind("\n", 0, i) + 1
        whole = window.rfind("\n", 0, i) >= 0
        found.append((whole, window[line_start : i + 1], window[i + 1 : end]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=TrainConfig().seed)
    parser.add_argument("--ops-seed", type=int, default=DataConfig().ops_seed)
    parser.add_argument("--examples", type=int, default=DataConfig().ops_examples)
    parser.add_argument("--batch-size", type=int, default=TrainConfig().batch_size)
    args = parser.parse_args()
    run = cfg.RunConfig()
    data = cfg.replace(run, dataset="ops", ops_seed=args.ops_seed, ops_examples=args.examples)
    dm = CharDataModule(
        data.data,
        block_size=run.model.block_size,
        batch_size=args.batch_size,
        seed=args.seed,
        eval_iters=run.train.eval_iters,
    )
    dm.setup()
    n_train = len(dm.train_ids)
    text = dm.corpus.text
    train_text, val_text = text[:n_train], text[n_train:]
    train_lines = train_text.split("\n")[:-1]  # the last piece may be cut by the split
    val_lines = val_text.split("\n")[1:-1]  # the first piece may start in training
    seen = set(train_lines)
    print(
        f"config: ops, {args.examples} examples, {data.data.ops_min_args}-"
        f"{data.data.ops_max_args} args, ops_seed {args.ops_seed}; block_size "
        f"{run.model.block_size}, batch {args.batch_size}, eval_iters "
        f"{run.train.eval_iters}, seed {args.seed}, val_fraction {data.data.val_fraction}"
    )
    overlap = sum(line in seen for line in val_lines)
    print(
        f"overlap: {overlap}/{len(val_lines)} complete validation lines occur in training "
        f"({100 * overlap / len(val_lines):.1f}%)"
    )
    by_args: dict[int, list[int]] = {}
    for line in val_lines:
        n_args = line[: line.index(")")].count(",") + 1
        by_args.setdefault(n_args, [0, 0])
        by_args[n_args][0] += line in seen
        by_args[n_args][1] += 1
    for n_args, (hit, total) in sorted(by_args.items()):
        print(f"  {n_args} arguments: {hit}/{total} ({100 * hit / total:.1f}%)")

    table = most_frequent_answers(train_lines)
    print(f"baseline table (most frequent training answer): {table}")
    right = 0
    for line in val_lines:
        question, answer = line[: line.rindex("=") + 1], line[line.rindex("=") + 1 :]
        right += baseline(question, table) == answer
    print(
        f"baseline on all complete validation lines: {right}/{len(val_lines)} "
        f"({100 * right / len(val_lines):.1f}%)"
    )

    ids = dm.val_ids
    code_total = whole_total = cut_total = base_right = 0
    for starts in dm.val_starts:
        x, y = batch_from(ids, starts, dm.block_size)
        code_total += answer_accuracy(x, y, y, dm.vocab)[1]
        for row in range(len(starts)):
            window = dm.vocab.decode(x[row]) + dm.vocab.decode(y[row, -1:])
            for whole, question, answer in window_answers(window):
                if whole:
                    whole_total += 1
                    base_right += baseline(question, table) == answer
                else:
                    cut_total += 1
    cut_scored = code_total - whole_total
    print(
        f"scored answers: the code scores {code_total}; {whole_total} have their whole "
        f"question in the window, {cut_total} more lie wholly inside with the question cut"
    )
    print(
        f"cut questions among the scored: {cut_scored}/{code_total} "
        f"({100 * cut_scored / max(code_total, 1):.1f}%)"
    )
    print(
        f"baseline on the answers with whole questions: {base_right}/{whole_total} "
        f"({100 * base_right / max(whole_total, 1):.1f}%)"
    )
    table_of_code = dm.answer_table
    right_code = total_code = 0
    for starts in dm.val_starts:
        x, y = batch_from(ids, starts, dm.block_size)
        guesses = baseline_predictions(x, dm.vocab, table_of_code)
        correct, total = answer_accuracy(x, y, guesses, dm.vocab)
        right_code, total_code = right_code + correct, total_code + total
    print(
        f"the run logs val/answer_baseline = {right_code}/{total_code} "
        f"({100 * right_code / max(total_code, 1):.1f}%)"
    )


if __name__ == "__main__":
    main()
