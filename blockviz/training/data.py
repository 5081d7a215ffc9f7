"""Character datasets as tensors: encoding, contiguous splits, batches, the DataModule.

The corpora and downloads live in `blockviz.core.corpora` and `blockviz.core.download`, the
vocabulary and the input checks in `blockviz.core.vocab` (no torch); this adds the tensors.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from blockviz.core import evaluation
from blockviz.core.config_train import DataConfig
from blockviz.core.corpora import (
    Corpus,
    fingerprint,
    load_corpus,
    ops_baseline_answer,
    ops_baseline_table,
)
from blockviz.core.download import Progress
from blockviz.core.vocab import (
    CharVocab,
    DataError,
    check_split,
)

_UTF32 = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"


def encode_tensor(vocab: CharVocab, text: str) -> torch.Tensor:
    """`vocab.encode(text)` as one int64 tensor (N,), via a code-point lookup table."""
    try:
        # One int32 per character, no per-character Python: ~13x faster than a list comprehension.
        codepoints = torch.frombuffer(bytearray(text.encode(_UTF32)), dtype=torch.int32)  # (N,)
    except UnicodeEncodeError:  # a lone surrogate: let the strict path name it
        return torch.tensor(vocab.encode(text), dtype=torch.int64)
    if codepoints.numel() == 0:
        return torch.zeros(0, dtype=torch.int64)
    vocab_codepoints = torch.tensor([ord(c) for c in vocab.chars], dtype=torch.int64)
    table = torch.full((int(vocab_codepoints.max()) + 2,), -1, dtype=torch.int64)
    table[vocab_codepoints] = torch.arange(vocab.size)
    # Code points past the table land on its last slot, which stays -1 (unknown).
    ids = table[codepoints.long().clamp_(max=len(table) - 1)]  # (N,)
    if bool((ids < 0).any()):
        vocab.encode(text)  # raises DataError naming the unseen characters
    return ids


def batch_from(
    ids: torch.Tensor, starts: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-character targets (B, block_size) of the windows at `starts` (B,)."""
    offsets = torch.arange(block_size + 1, device=starts.device)  # (T+1,)
    windows = ids[starts[:, None] + offsets]  # (B, T+1)
    # contiguous: callers flatten targets with .view(-1) for the cross-entropy
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T), (B, T)


def evaluation_starts(n_starts: int, n_windows: int) -> torch.Tensor:
    """The first `n_windows` start positions (n_windows,) of the evaluation set, in [0, n_starts).

    Drawn from the fixed evaluation seed, `EVAL_DRAW` at a time, so a smaller count's starts
    are a prefix of a larger count's and no training seed ever changes them.
    """
    generator = torch.Generator().manual_seed(evaluation.EVAL_SEED)
    draws = -(-n_windows // evaluation.EVAL_DRAW)  # ceil
    chunks = [
        torch.randint(n_starts, (evaluation.EVAL_DRAW,), generator=generator) for _ in range(draws)
    ]
    return torch.cat(chunks)[:n_windows] if chunks else torch.zeros(0, dtype=torch.int64)


class _RandomWindows(IterableDataset):
    """Endless training batches of random windows, reproducible from a seed."""

    def __init__(
        self, ids: torch.Tensor, block_size: int, batch_size: int, seed: int, skip: int = 0
    ) -> None:
        self.ids, self.block_size, self.batch_size, self.seed = ids, block_size, batch_size, seed
        self.skip = skip  # batches already trained on (a resume, a fork): drawn, not yielded

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # A fresh generator per iteration: iterating twice replays the same batches.
        generator = torch.Generator().manual_seed(self.seed)
        n_starts = len(self.ids) - self.block_size  # last start leaves room for one target
        for _ in range(self.skip):  # batch k is the k-th draw, whichever step training starts at
            torch.randint(n_starts, (self.batch_size,), generator=generator)
        while True:
            starts = torch.randint(n_starts, (self.batch_size,), generator=generator)  # (B,)
            yield batch_from(self.ids, starts, self.block_size)


class _ReplicaWindows(IterableDataset):
    """K replicas' training batches stacked, (K, B, T): replica i's are exactly the
    batches `_RandomWindows` draws from its own seed, so a replica sees its solo run's data."""

    def __init__(
        self, ids: torch.Tensor, block_size: int, batch_size: int, seeds: list[int], skip: int = 0
    ):
        self.streams = [_RandomWindows(ids, block_size, batch_size, s, skip) for s in seeds]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batches in zip(*(iter(stream) for stream in self.streams), strict=True):
            xs, ys = zip(*batches, strict=True)
            yield torch.stack(xs), torch.stack(ys)  # (K, B, T) each


class _FixedWindows(IterableDataset):
    """The same validation batches every time; every DDP rank evaluates all of them."""

    def __init__(self, ids: torch.Tensor, starts: torch.Tensor, block_size: int) -> None:
        self.ids, self.starts, self.block_size = ids, starts, block_size  # starts: (n, B)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch_starts in self.starts:
            yield batch_from(self.ids, batch_starts, self.block_size)


class CharDataModule(L.LightningDataModule):
    """One corpus, its vocabulary, a contiguous train/val split and the two loaders."""

    def __init__(
        self,
        data_cfg: DataConfig,
        block_size: int,
        batch_size: int,
        seed: int = 1337,
        eval_iters: int = 20,
        corpus: Corpus | None = None,
        progress: Progress | None = None,
        legacy_eval: bool = False,
        replica_seeds: list[int] | None = None,
    ) -> None:
        super().__init__()
        sizes = (("block_size", block_size), ("batch_size", batch_size), ("eval_iters", eval_iters))
        for name, value in sizes:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DataError(f"{name}: {value!r} is not allowed; must be an integer >= 1")
        self.data_cfg = data_cfg.validate()
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.eval_iters = eval_iters
        self._given_corpus = corpus
        self._progress = progress  # told how a first download goes (Tiny Shakespeare)
        # A run recorded before the evaluation set, resumed: it keeps its own ruler, the
        # windows its training seed drew, so its val curve stays one measurement.
        self.legacy_eval = legacy_eval
        # Replicas (blockviz.training.replicas): one training stream per seed, stacked.
        self.replica_seeds = list(replica_seeds) if replica_seeds is not None else None
        self.corpus: Corpus | None = None
        self.vocab: CharVocab | None = None
        self.train_ids: torch.Tensor | None = None
        self.val_ids: torch.Tensor | None = None
        self.val_starts: torch.Tensor | None = None
        self.fingerprint: dict[str, Any] | None = None
        # ops only: the trivial baseline's most frequent training answer per op
        self.answer_table: dict[str, str] | None = None

    def prepare_data(self) -> None:
        """Download once per node before the ranks set up (Lightning calls this on rank 0)."""
        if self._given_corpus is None and self.data_cfg.dataset == "shakespeare":
            load_corpus(self.data_cfg, self._progress)

    def setup(self, stage: str | None = None) -> None:
        """Load, build the vocabulary from the whole text, encode once and split (idempotent)."""
        if self.train_ids is not None:
            return
        corpus = self._given_corpus or load_corpus(self.data_cfg, self._progress)
        n_train, n_val = check_split(
            len(corpus.text), self.data_cfg.val_fraction, self.block_size, repr(corpus.name)
        )
        vocab = CharVocab.from_text(corpus.text)
        ids = encode_tensor(vocab, corpus.text)  # (N,)
        self.corpus, self.vocab = corpus, vocab
        self.train_ids, self.val_ids = ids[:n_train], ids[n_train:]  # (N_train,), (N_val,)
        # Every run of this text and block size is scored on the same windows, whatever its
        # seed (blockviz.core.evaluation says why and how).
        n_windows = self.eval_iters * self.batch_size
        if self.legacy_eval:
            generator = torch.Generator().manual_seed(self.seed + evaluation.LEGACY_OFFSET)
            shape = (self.eval_iters, self.batch_size)
            self.val_starts = torch.randint(n_val - self.block_size, shape, generator=generator)
            scored = evaluation.legacy_record(n_windows, self.block_size, self.seed)
        else:
            starts = evaluation_starts(n_val - self.block_size, n_windows)
            self.val_starts = starts.view(self.eval_iters, self.batch_size)  # (iters, B)
            scored = evaluation.record(n_windows, self.block_size)
        self.fingerprint = {**fingerprint(corpus, vocab, n_train, n_val), evaluation.KEY: scored}
        if self.data_cfg.dataset == "ops":
            self.answer_table = ops_baseline_table(corpus.text[:n_train])

    def train_dataloader(self) -> DataLoader:
        """Endless random training batches (x, y), each (batch_size, block_size) int64 (with
        replica seeds: (replicas, batch_size, block_size), one stream per seed)."""
        self.setup()
        # The step training starts at: a restored checkpoint's (Lightning restores it before
        # it asks for this loader), 0 for a fresh fit; batch k is the k-th draw.
        trainer = getattr(self, "trainer", None)
        skip = int(getattr(trainer, "global_step", 0) or 0)
        if self.replica_seeds is not None:
            stacked = _ReplicaWindows(
                self.train_ids, self.block_size, self.batch_size, self.replica_seeds, skip
            )
            return DataLoader(stacked, batch_size=None, num_workers=0)
        # Each DDP rank draws its own windows; a run restarted with the same seed repeats,
        # and one restored at step N (a resume, a fork) goes on with batch N.
        rank = int(trainer.global_rank) if trainer is not None else 0
        windows = _RandomWindows(
            self.train_ids, self.block_size, self.batch_size, self.seed + rank, skip
        )
        return DataLoader(windows, batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        """`eval_iters` fixed validation batches: the evaluation set, the same for every seed."""
        self.setup()
        windows = _FixedWindows(self.val_ids, self.val_starts, self.block_size)
        return DataLoader(windows, batch_size=None, num_workers=0)

    def state_dict(self) -> dict[str, Any]:
        """Saved in checkpoints: the vocabulary and fingerprint of the text trained on."""
        if self.vocab is None:
            return {}
        return {"vocab": self.vocab.to_json(), "fingerprint": self.fingerprint}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """On resume, refuse a text whose vocabulary differs from the checkpoint's."""
        saved = state_dict.get("vocab")
        if saved is None or self.vocab is None:
            return
        if CharVocab.from_json(saved) != self.vocab:
            was = (state_dict.get("fingerprint") or {}).get("name", "?")
            raise DataError(
                f"the checkpoint was trained on {was!r} with a different vocabulary than "
                f"{self.corpus.name!r}; resume with the same dataset"
            )


def answer_accuracy(
    x: torch.Tensor, y: torch.Tensor, predictions: torch.Tensor, vocab: CharVocab
) -> tuple[int, int]:
    """(correct, total) answers of the ops task in a batch, by exact match.

    An answer is the characters after '=' up to and including the '\\n' that ends its
    line. Only answers whose whole line is inside the window count: the newline before
    the question and the '=' among the inputs `x`, the answer's newline among the targets
    `y`. A question cut by the window's start is not scored, since the model could not
    see it. An answer is correct when every one of its target positions has
    predictions == y; with teacher forcing this is exactly whether greedy decoding from
    '=' would write it. `predictions` is the argmax of the logits, (B, T) like x and y.
    If a line holds two '=', the answer follows the last one. A vocabulary without '='
    or '\\n' gives (0, 0).
    """
    if "=" not in vocab or "\n" not in vocab:
        return 0, 0
    batch, steps = y.shape
    positions = torch.arange(steps, device=y.device).expand(batch, steps)  # (B, T)
    none = torch.full_like(positions, -1)
    # An answer's first target sits where the input is '='; track the latest such start.
    last_start = torch.where(x == vocab.index("="), positions, none).cummax(dim=1).values
    newline = y == vocab.index("\n")  # (B, T)
    last_newline = torch.where(newline, positions, none).cummax(dim=1).values  # (B, T)
    newline_before = torch.cat([none[:, :1], last_newline[:, :-1]], dim=1)  # strictly before t
    in_answer = last_start > newline_before  # (B, T): since the start, no line has ended yet
    wrong = in_answer & (predictions != y)  # (B, T)
    # Mistakes per answer, keyed by (row, start); an answer's end looks its start up.
    start = last_start.clamp(min=0)  # (B, T)
    mistakes = torch.zeros(batch, steps, dtype=torch.int64, device=y.device)
    mistakes.scatter_add_(1, start, wrong.long())  # (B, T)
    # The question starts in the window when an input newline precedes its '='.
    input_newline = torch.where(x == vocab.index("\n"), positions, none).cummax(dim=1).values
    question_whole = input_newline.gather(1, start) >= 0  # (B, T)
    ends = newline & in_answer & question_whole  # (B, T): one True per scored answer
    correct = ends & (mistakes.gather(1, start) == 0)  # (B, T)
    return int(correct.sum()), int(ends.sum())


def baseline_predictions(x: torch.Tensor, vocab: CharVocab, table: dict[str, str]) -> torch.Tensor:
    """The trivial baseline's teacher-forced predictions (B, T) for the answers in `x`.

    After each '=' whose line starts in the window, the targets get the guess of
    `ops_baseline_answer` and a newline; everywhere else -1, which matches no target. So
    `answer_accuracy(x, y, baseline_predictions(...), vocab)` scores the baseline on
    exactly the answers it scores the model on.
    """
    predictions = torch.full(x.shape, -1, dtype=torch.int64)  # (B, T)
    steps = x.shape[1]
    for row, ids in enumerate(x.tolist()):
        text = vocab.decode(ids)
        equals = text.find("=")
        while equals >= 0:
            line_start = text.rfind("\n", 0, equals)
            guess = ops_baseline_answer(text[line_start + 1 : equals + 1], table)
            if line_start >= 0 and guess is not None and all(c in vocab for c in guess):
                # Target t predicts input t + 1: the answer's first character is target `equals`.
                written = vocab.encode(guess + "\n")[: steps - equals]
                predictions[row, equals : equals + len(written)] = torch.tensor(written)
            equals = text.find("=", equals + 1)
    return predictions.to(x.device)
