"""Shared test fixtures that are plain functions (importable, unlike conftest's)."""

from __future__ import annotations

import re
from typing import Any

from blockviz.core import config as cfg

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
