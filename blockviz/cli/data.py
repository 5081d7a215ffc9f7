"""`python -m blockviz data`: statistics and a sample of a dataset."""

from __future__ import annotations

import argparse

from blockviz.core.config import check_int, from_dict
from blockviz.core.config_train import DataConfig
from blockviz.core.corpora import fingerprint, load_corpus
from blockviz.core.download import DownloadProgress
from blockviz.core.flags import config_overrides
from blockviz.core.vocab import (
    CharVocab,
    DataError,
    check_split,
    min_chars,
    split_sizes,
)


def _symbols(chars: list[str]) -> str:
    """The vocabulary as one Python string literal, so whitespace and controls are visible."""
    return repr("".join(chars))


def cli_main(args: argparse.Namespace) -> int:
    """`python -m blockviz data`: statistics and a sample of a dataset."""
    data_cfg = from_dict(DataConfig, config_overrides(args, ["data"])).validate()
    if args.sample_chars < 0:
        raise DataError(f"--sample_chars: {args.sample_chars} is not allowed; must be >= 0")
    if args.block_size is not None:
        check_int("block_size", args.block_size)
    progress = DownloadProgress()
    try:
        corpus = load_corpus(data_cfg, progress)
    finally:
        progress.finish()
    n_chars = len(corpus.text)
    if args.block_size is not None:
        n_train, n_val = check_split(
            n_chars, data_cfg.val_fraction, args.block_size, repr(corpus.name)
        )
    else:
        n_train, n_val = split_sizes(n_chars, data_cfg.val_fraction)
    vocab = CharVocab.from_text(corpus.text)
    stats = fingerprint(corpus, vocab, n_train, n_val)
    rows = [
        ("dataset", corpus.name),
        ("source", corpus.source),
        ("characters", f"{n_chars:,}"),
        ("vocabulary", f"{vocab.size} symbols: {_symbols(vocab.chars)}"),
        ("train", f"{n_train:,} characters"),
        ("val", f"{n_val:,} characters (the last {100 * data_cfg.val_fraction:g}% of the text)"),
        ("sha256", stats["sha256"]),
    ]
    if args.block_size is not None:
        need = min_chars(args.block_size, data_cfg.val_fraction)
        rows.append(("block_size", f"{args.block_size}: long enough (needs >= {need:,} chars)"))
    for label, value in rows:
        print(f"{label:<11} {value}")
    if args.sample_chars:
        print(f"\nsample (first {min(args.sample_chars, n_chars):,} characters):")
        print(corpus.text[: args.sample_chars])
    return 0
