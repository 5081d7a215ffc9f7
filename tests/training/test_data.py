"""Corpora, input checks, vocabulary, splits, batches, answer accuracy and `blockviz data`."""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import socket
import sysconfig
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from blockviz import cli
from blockviz.core import corpora, evaluation
from blockviz.core.bounds import MAX_VOCAB
from blockviz.core.config_train import DataConfig
from blockviz.core.corpora import (
    BUILTIN,
    PYCODE_MAX_CHARS,
    Corpus,
    check_text_bytes,
    load_corpus,
    read_text_file,
)
from blockviz.core.vocab import CharVocab, DataError, min_chars, split_sizes, unigram_nats
from blockviz.training.data import (
    CharDataModule,
    answer_accuracy,
    batch_from,
    encode_tensor,
    evaluation_starts,
)

torch.set_num_threads(1)

SHARED_SHAKESPEARE = Path("/work/shared/data/tinyshakespeare.txt")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a network connection fails the test."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a built-in corpus tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _module(text: str, **kwargs: object) -> CharDataModule:
    """A data module over an in-memory text (val_fraction from kwargs, default 0.1)."""
    data_cfg = DataConfig(dataset="inline", val_fraction=kwargs.pop("val_fraction", 0.1))
    params = {"block_size": 8, "batch_size": 4, "eval_iters": 3} | kwargs
    return CharDataModule(data_cfg, corpus=Corpus("inline", "test", text), **params)


def _set_up(module: CharDataModule) -> CharDataModule:
    module.setup()
    return module


def _random_text(n: int, alphabet: str, seed: int) -> str:
    """n characters drawn uniformly from alphabet, reproducibly."""
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(n))


# ---------------------------------------------------------------- built-in corpora


def test_pydocs_loads_offline_and_is_stable(offline: None) -> None:
    first = load_corpus(DataConfig(dataset="pydocs"))
    second = load_corpus(DataConfig(dataset="pydocs"))
    assert first.name == "pydocs"
    assert len(first.text) > 100_000
    assert first.text == second.text
    assert "assert" in first.text  # the reference docs' own words, not a placeholder


def test_pycode_loads_offline_under_its_cap_from_sorted_stdlib_files(offline: None) -> None:
    corpus = load_corpus(DataConfig(dataset="pycode"))
    assert 0 < len(corpus.text) <= PYCODE_MAX_CHARS
    assert corpus.text.startswith("# file: ")
    headers = re.findall(r"^# file: (\S+)$", corpus.text, flags=re.MULTILINE)
    stdlib = Path(sysconfig.get_path("stdlib"))
    # Other lines may look like headers only inside a file; the real ones come in order.
    listed = [path for path in headers if (stdlib / path).is_file()]
    assert listed == sorted(listed)
    assert len(listed) > 10
    for path in listed:
        parts = Path(path).parts
        assert "site-packages" not in parts and "test" not in parts and "tests" not in parts
    # Whole files: the corpus ends where a file ends.
    last_source = (stdlib / listed[-1]).read_text(encoding="utf-8")
    assert corpus.text.endswith(last_source if last_source.endswith("\n") else last_source + "\n")


def test_pycode_skips_test_dirs_and_site_packages(tmp_path: Path) -> None:
    for rel in ["b.py", "a/x.py", "test/t.py", "a/tests/u.py", "site-packages/p.py", "c.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("pass\n")
    found = [p.relative_to(tmp_path).as_posix() for p in corpora.pycode_files(tmp_path)]
    assert found == ["a/x.py", "b.py"]


OPS_LINE = re.compile(r"^(max|min|first|last|sum)\(([0-9](?:,[0-9])*)\)(%10)?=([0-9])$")


def _expected_answer(op: str, args: list[int]) -> int:
    """Recompute an ops answer independently of the generator."""
    return {
        "max": max(args),
        "min": min(args),
        "first": args[0],
        "last": args[-1],
        "sum": sum(args) % 10,
    }[op]


@pytest.mark.parametrize(
    ("n", "low", "high", "seed"), [(500, 2, 5, 0), (50, 1, 1, 3), (300, 9, 9, 7)]
)
def test_ops_lines_are_well_formed_with_correct_answers(
    n: int, low: int, high: int, seed: int, offline: None
) -> None:
    data_cfg = DataConfig(
        dataset="ops", ops_examples=n, ops_min_args=low, ops_max_args=high, ops_seed=seed
    )
    text = load_corpus(data_cfg).text
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    assert len(lines) == n
    assert len(set(lines)) == n  # each example once, so no line can be in both splits
    seen_ops = set()
    for line in lines:
        match = OPS_LINE.match(line)
        assert match, line
        op, arg_text, modulo, answer = match.groups()
        args = [int(a) for a in arg_text.split(",")]
        assert low <= len(args) <= high
        assert (modulo is not None) == (op == "sum")
        assert int(answer) == _expected_answer(op, args), line
        seen_ops.add(op)
    assert seen_ops == {"max", "min", "first", "last", "sum"}
    assert load_corpus(data_cfg).text == text
    other_seed = DataConfig(dataset="ops", ops_examples=n, ops_min_args=low, ops_max_args=high)
    other_seed.ops_seed = seed + 1
    assert load_corpus(other_seed).text != text


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"abc\x00def", "NUL byte at byte offset 3"),
        (b"caf\xc3\xa9 \xff ok", "not UTF-8 text (byte 0xff at byte offset 6"),
        (b"\xef\xbb\xbf", "only a byte-order mark"),
    ],
)
def test_bad_text_gets_its_message_for_files_and_uploads(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(message)):
        load_corpus(DataConfig(dataset=str(path)))
    with pytest.raises(DataError, match=re.escape(message)):
        check_text_bytes(content, "upload.txt")


def test_too_large_text_is_refused_for_files_and_uploads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpora, "MAX_TEXT_BYTES", 10)
    path = tmp_path / "big.txt"
    path.write_text("x" * 11)
    with pytest.raises(DataError, match="11 bytes, larger than the 10-byte limit"):
        read_text_file(path)
    with pytest.raises(DataError, match="larger than the 10-byte limit"):
        check_text_bytes(b"y" * 11, "upload.txt")
    assert check_text_bytes(b"z" * 10, "upload.txt") == "z" * 10


def test_missing_path_directory_and_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_text_file(tmp_path / "absent.txt")
    with pytest.raises(DataError, match="is a directory"):
        load_corpus(DataConfig(dataset=str(tmp_path)))
    with pytest.raises(DataError) as caught:
        load_corpus(DataConfig(dataset="shakespear"))
    assert "'shakespear'" in str(caught.value)
    for name in BUILTIN:
        assert name in str(caught.value)


# ---------------------------------------------------------------- special files (issue 10)


def finished_within(seconds: float, call: Callable[[], object], fifo: Path | None = None) -> object:
    """What `call` returned or raised, if it ends in time; a hang fails the test instead."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        if fifo is not None:  # a writer lets a reader blocked on the FIFO go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"still blocked after {seconds} s")
    return outcome[0]


def special_file(kind: str, tmp_path: Path) -> Path:
    """A path of the given kind that is not a regular file."""
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.txt")
        return tmp_path / "pipe.txt"
    if kind == "directory":
        (tmp_path / "folder.txt").mkdir()
        return tmp_path / "folder.txt"
    if kind == "socket":
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(tmp_path / "sock.txt"))  # the socket file outlives the socket
        return tmp_path / "sock.txt"
    if not Path("/dev/zero").exists():
        pytest.skip("this system has no /dev/zero")
    return Path("/dev/zero")


SPECIAL_KINDS = {
    "fifo": "a named pipe (FIFO)",
    "directory": "a directory",
    "socket": "a socket",
    "device": "a character device",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(SPECIAL_KINDS))
def test_files_that_are_not_regular_are_refused_at_once(kind: str, tmp_path: Path) -> None:
    path = special_file(kind, tmp_path)
    fifo = path if kind == "fifo" else None
    for call in (
        lambda: read_text_file(path),
        lambda: load_corpus(DataConfig(dataset=str(path))),
    ):
        error = finished_within(10, call, fifo)
        assert isinstance(error, DataError), error
        assert str(error).startswith(f"{path} is {SPECIAL_KINDS[kind]}, not a regular file;")


@pytest.mark.timeout(60)
def test_cli_data_refuses_a_fifo_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = special_file("fifo", tmp_path)
    assert finished_within(10, lambda: cli.main(["data", "--dataset", str(fifo)]), fifo) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{fifo} is a named pipe (FIFO), not a regular file" in err


def many_symbols(count: int) -> str:
    """A text of `count` distinct CJK characters, each once, then a newline."""
    return "".join(chr(0x4E00 + i) for i in range(count - 1)) + "\n"


def test_a_vocabulary_past_the_cap_is_refused_for_files_uploads_and_vocabularies(
    tmp_path: Path,
) -> None:
    text = many_symbols(MAX_VOCAB + 1)
    path = tmp_path / "symbols.txt"
    path.write_text(text, encoding="utf-8")
    expected = (
        f"has {MAX_VOCAB + 1:,} distinct characters, more than the {MAX_VOCAB:,} a "
        "character vocabulary may hold"
    )
    for call, label in (
        (lambda: load_corpus(DataConfig(dataset=str(path))), str(path)),
        (lambda: check_text_bytes(text.encode(), "upload.txt"), "upload.txt"),
        (lambda: CharVocab.from_text(text), "the text"),
    ):
        with pytest.raises(DataError) as caught:
            call()
        assert str(caught.value).startswith(f"{label} {expected}")


def test_a_vocabulary_at_the_cap_is_accepted(tmp_path: Path) -> None:
    text = many_symbols(MAX_VOCAB)
    path = tmp_path / "symbols.txt"
    path.write_text(text, encoding="utf-8")
    assert CharVocab.from_text(load_corpus(DataConfig(dataset=str(path))).text).size == MAX_VOCAB


def test_cli_data_refuses_too_many_symbols_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "symbols.txt"
    path.write_text(many_symbols(MAX_VOCAB + 5), encoding="utf-8")
    assert cli.main(["data", "--dataset", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{MAX_VOCAB + 5:,} distinct characters" in err and f"{MAX_VOCAB:,}" in err


def test_file_corpus_strips_bom_and_windows_line_endings(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    corpus = load_corpus(DataConfig(dataset=str(path)))
    assert corpus.text == "one\ntwo\n"
    assert corpus.name == "notes.txt"
    assert corpus.source == str(path.resolve())


@pytest.mark.parametrize(("block_size", "val_fraction"), [(8, 0.1), (64, 0.1), (5, 0.5), (31, 0.3)])
def test_too_short_text_names_the_length_it_needs(block_size: int, val_fraction: float) -> None:
    need = min_chars(block_size, val_fraction)
    assert min(split_sizes(need, val_fraction)) >= block_size + 1
    short = _module(("ab" * need)[: need - 1], block_size=block_size, val_fraction=val_fraction)
    with pytest.raises(DataError) as caught:
        short.setup()
    assert f"at least {need:,} characters" in str(caught.value)
    assert f"block_size={block_size}" in str(caught.value)
    exact = _module(("ab" * need)[:need], block_size=block_size, val_fraction=val_fraction)
    exact.setup()
    batch_x, _ = next(iter(exact.val_dataloader()))
    assert batch_x.shape[1] == block_size


# ---------------------------------------------------------------- vocabulary


def test_vocab_round_trips_through_json_and_decodes_what_it_encodes() -> None:
    text = "héllo, wörld 🙂\n\tend"
    vocab = CharVocab.from_text(text)
    again = CharVocab.from_json(vocab.to_json())
    assert again == vocab and again.chars == sorted(set(text)) and again.size == len(set(text))
    assert again.decode(vocab.encode(text)) == text
    assert again.decode(torch.tensor(vocab.encode(text))) == text


def test_strict_encode_names_the_unseen_character_and_its_position() -> None:
    vocab = CharVocab.from_text("abc ")
    with pytest.raises(DataError) as caught:
        vocab.encode("ab€c")
    assert "'€' at position 2" in str(caught.value)
    assert "replace_unknown=True" in str(caught.value)


def test_replace_unknown_writes_the_documented_replacement() -> None:
    with_space = CharVocab.from_text("ab c")
    assert with_space.decode(with_space.encode("a€b", replace_unknown=True)) == "a b"
    without_space = CharVocab.from_text("xyz")
    assert without_space.replacement == "x"
    assert without_space.decode(without_space.encode("zQ", replace_unknown=True)) == "zx"


@pytest.mark.parametrize("text", ["", "not json", '{"chars": "ab"}', '{"chars": ["a", "a"]}'])
def test_bad_vocab_json_raises_data_error(text: str) -> None:
    with pytest.raises(DataError):
        CharVocab.from_json(text)


def test_decode_refuses_ids_outside_the_vocabulary() -> None:
    vocab = CharVocab.from_text("ab")
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        vocab.decode([0, 2])
    with pytest.raises(DataError):
        vocab.decode([-1])


def test_encode_tensor_matches_encode_including_astral_characters() -> None:
    text = "abc🙂déf\n" * 50 + "zz"
    vocab = CharVocab.from_text(text)
    ids = encode_tensor(vocab, text)
    assert ids.dtype == torch.int64
    assert ids.tolist() == vocab.encode(text)
    with pytest.raises(DataError, match="'🚀' at position 1"):
        encode_tensor(vocab, "a🚀")
    with pytest.raises(DataError, match="'q' at position 0"):
        encode_tensor(vocab, "q")


# ---------------------------------------------------------------- splits and batches


def test_split_is_contiguous_with_validation_last_and_fingerprint_matches() -> None:
    text = _random_text(1000, "abcdefgh\n", seed=0)
    module = _module(text, val_fraction=0.2)
    module.setup()
    vocab = module.vocab
    assert vocab.decode(module.train_ids) + vocab.decode(module.val_ids) == text
    assert len(module.val_ids) == 200
    fingerprint = module.fingerprint
    assert fingerprint == {
        "name": "inline",
        "source": "test",
        "n_chars": 1000,
        "vocab_size": len(set(text)),
        "n_train": 800,
        "n_val": 200,
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        # The reference losses: frequencies of the training split; uniform over the vocab.
        "unigram_nats": round(unigram_nats(text[:800]), 6),
        "init_loss": round(math.log(len(set(text))), 6),
        # 3 batches of 4 windows of 8 characters from the evaluation seed
        "evaluation": evaluation.record(12, 8),
    }
    counts = Counter(text[:800])
    by_hand = -sum(c / 800 * math.log(c / 800) for c in counts.values())
    assert fingerprint["unigram_nats"] == pytest.approx(by_hand, abs=1e-6)
    train_ids = module.train_ids
    module.setup()  # idempotent: nothing is reloaded or re-encoded
    assert module.train_ids is train_ids


def test_targets_are_inputs_shifted_by_one_and_windows_are_real_text() -> None:
    text = _random_text(2000, "abcdefghijklmnop", seed=1)
    module = _module(text, block_size=16, batch_size=5)
    module.setup()
    train_text = module.vocab.decode(module.train_ids)
    batches = iter(module.train_dataloader())
    for _ in range(5):
        x, y = next(batches)
        assert x.shape == y.shape == (5, 16)
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        for row_x, row_y in zip(x, y, strict=True):
            window = module.vocab.decode(row_x) + module.vocab.decode(row_y[-1:])
            assert window in train_text


def test_batch_from_gathers_the_windows_at_the_given_starts() -> None:
    ids = torch.arange(100) * 3
    x, y = batch_from(ids, torch.tensor([0, 10, 96]), block_size=3)
    assert x.tolist() == [[0, 3, 6], [30, 33, 36], [288, 291, 294]]
    assert y.tolist() == [[3, 6, 9], [33, 36, 39], [291, 294, 297]]
    assert x.is_contiguous() and y.is_contiguous()


def test_training_batches_come_from_the_training_split_only() -> None:
    # Train and validation halves use disjoint alphabets, so any leak is visible.
    text = _random_text(100, "abcd", seed=2) + _random_text(100, "wxyz", seed=2)
    module = _module(text, val_fraction=0.5, block_size=32, batch_size=8, eval_iters=5)
    module.setup()
    train_ids = {module.vocab.index(c) for c in "abcd"}
    val_ids = {module.vocab.index(c) for c in "wxyz"}
    batches = iter(module.train_dataloader())
    for _ in range(200):  # 1,600 windows over 68 possible starts: the last one is drawn too
        x, y = next(batches)
        assert set(x.unique().tolist()) | set(y.unique().tolist()) <= train_ids
    val_batches = list(module.val_dataloader())
    assert len(val_batches) == 5
    for x, y in val_batches:
        assert x.shape == y.shape == (8, 32) and x.dtype == torch.int64
        assert set(x.unique().tolist()) | set(y.unique().tolist()) <= val_ids


def _val_windows(module: CharDataModule) -> list[torch.Tensor]:
    module.setup()
    return [x for x, _ in module.val_dataloader()]


def test_validation_windows_are_the_same_for_every_training_seed() -> None:
    """One evaluation set: a seed changes training, never the text a run is scored on."""
    text = _random_text(3000, "abcdefgh", seed=3)
    first = _val_windows(_module(text, seed=5))
    for seed in (6, 0, 2**32 - 1):
        other = _val_windows(_module(text, seed=seed))
        assert all(torch.equal(a, b) for a, b in zip(first, other, strict=True)), seed
    # The training batches still follow the seed.
    assert not torch.equal(
        _first_train_batches(_module(text, seed=5))[0],
        _first_train_batches(_module(text, seed=6))[0],
    )
    # Iterating the loader again gives the same windows (no hidden state between evals).
    module = _module(text, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(_val_windows(module), first, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(_val_windows(module), first, strict=True))


def test_evaluation_windows_depend_on_their_count_only_as_a_prefix() -> None:
    """A batch size that differs with the same eval_iters × batch_size scores the same
    windows; a larger evaluation scores a superset that starts with the smaller one."""
    text = _random_text(5000, "abcdefgh", seed=8)
    narrow = torch.cat(_val_windows(_module(text, batch_size=4, eval_iters=30)))  # 120 windows
    wide = torch.cat(_val_windows(_module(text, batch_size=40, eval_iters=3)))
    assert torch.equal(narrow, wide)
    small = torch.cat(_val_windows(_module(text, batch_size=5, eval_iters=7)))  # 35 windows
    assert torch.equal(small, narrow[:35])
    n_starts = 200
    starts = evaluation_starts(n_starts, 150)
    assert starts.shape == (150,) and int(starts.min()) >= 0 and int(starts.max()) < n_starts
    assert torch.equal(evaluation_starts(n_starts, 64), starts[:64])
    assert evaluation_starts(n_starts, 0).shape == (0,)


def test_a_resumed_old_run_keeps_the_windows_its_training_seed_drew() -> None:
    """Runs recorded before the evaluation set drew their windows from seed + 1,000,003;
    resumed (legacy_eval), they still do, so one run's val curve is one measurement."""
    text = _random_text(3000, "abcdefgh", seed=3)
    module = _module(text, seed=5, legacy_eval=True)
    module.setup()
    generator = torch.Generator().manual_seed(5 + 1_000_003)
    n_starts = len(module.val_ids) - module.block_size
    assert torch.equal(module.val_starts, torch.randint(n_starts, (3, 4), generator=generator))
    assert module.fingerprint[evaluation.KEY]["scheme"] == evaluation.LEGACY_SCHEME
    assert "training seed" in evaluation.scored_on(module.fingerprint)
    assert not torch.equal(module.val_starts, _set_up(_module(text, seed=5)).val_starts)


def test_the_fingerprint_records_how_the_run_is_scored() -> None:
    text = _random_text(3000, "abcdefgh", seed=3)
    module = _module(text, seed=5, batch_size=4, eval_iters=3)
    module.setup()
    recorded = module.fingerprint[evaluation.KEY]
    assert recorded == {
        "scheme": evaluation.SCHEME,
        "seed": evaluation.EVAL_SEED,
        "windows": 12,
        "block_size": 8,
    }
    assert evaluation.same_text(module.fingerprint)
    assert "evaluation seed" in evaluation.scored_on(module.fingerprint)
    # A run recorded before the evaluation set says its windows followed its seed.
    old = {k: v for k, v in module.fingerprint.items() if k != evaluation.KEY}
    assert not evaluation.same_text(old)
    assert "training seed" in evaluation.scored_on(old)


def _first_train_batches(module: CharDataModule, n: int = 3) -> list[torch.Tensor]:
    module.setup()
    batches = iter(module.train_dataloader())
    return [next(batches)[0] for _ in range(n)]


def test_training_batches_are_reproducible_and_differ_across_seeds_and_ranks() -> None:
    text = _random_text(3000, "abcdefgh", seed=4)
    base = _first_train_batches(_module(text, seed=1))
    again = _first_train_batches(_module(text, seed=1))
    reseeded = _first_train_batches(_module(text, seed=2))
    rank_one = _module(text, seed=1)
    rank_one.trainer = SimpleNamespace(global_rank=1)
    ranked = _first_train_batches(rank_one)
    assert all(torch.equal(a, b) for a, b in zip(base, again, strict=True))
    assert not torch.equal(base[0], reseeded[0])
    assert not torch.equal(base[0], ranked[0])


class _Bigram(L.LightningModule):
    """The smallest model that trains on (x, y) batches; counts validation batches."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.logits = torch.nn.Embedding(vocab_size, vocab_size)
        self.val_batches = 0

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        logits = self.logits(x)  # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        self.val_batches += 1

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_data_module_drives_a_lightning_trainer(tmp_path: Path) -> None:
    module = CharDataModule(
        DataConfig(dataset="ops", ops_examples=200), block_size=16, batch_size=4, eval_iters=3
    )
    module.setup()
    model = _Bigram(module.vocab.size)
    trainer = L.Trainer(
        max_steps=4,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=module)
    assert trainer.global_step == 4
    assert model.val_batches == 2 * 3  # two evaluations of eval_iters fixed batches
    state = module.state_dict()
    assert CharVocab.from_json(state["vocab"]) == module.vocab
    module.load_state_dict(state)  # same data: accepted
    other = _module("completely different text " * 20)
    other.setup()
    with pytest.raises(DataError, match="different vocabulary"):
        other.load_state_dict(state)


@pytest.mark.parametrize(
    ("name", "value"), [("block_size", 0), ("batch_size", -1), ("eval_iters", 0)]
)
def test_data_module_refuses_bad_sizes(name: str, value: int) -> None:
    with pytest.raises(DataError, match=name):
        _module("abc" * 100, **{name: value})


# ---------------------------------------------------------------- answer accuracy


def _window(text: str, vocab: CharVocab) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor(vocab.encode(text))  # (T+1,)
    return ids[None, :-1], ids[None, 1:]  # (1, T), (1, T)


OPS_VOCAB = CharVocab.from_text("max(0123456789,)=\nminfirstlastsum%")


def test_answer_accuracy_all_right_one_wrong_and_cut_answers() -> None:
    # The tail of a line whose '=' lies before the window, two whole lines, a cut answer.
    text = "9\nmax(3,9,1)=9\nsum(4,7)%10=1\nmin(1,2)=1"
    x, y = _window(text, OPS_VOCAB)
    # Target t predicts text[t + 1], so an answer after the '=' at i has targets i, i + 1.
    max_answer = [text.index("=9\nsum"), text.index("=9\nsum") + 1]
    sum_answer = [text.index("%10=") + 3, text.index("%10=") + 4]
    assert answer_accuracy(x, y, y.clone(), OPS_VOCAB) == (2, 2)

    for position in max_answer + sum_answer:  # any wrong character fails its answer only
        wrong = y.clone()
        wrong[0, position] = (wrong[0, position] + 1) % OPS_VOCAB.size
        assert answer_accuracy(x, y, wrong, OPS_VOCAB) == (1, 2)

    # Mistakes everywhere outside the two whole answers (questions, cut lines) do not count.
    outside = torch.ones(y.shape[1], dtype=torch.bool)
    outside[max_answer + sum_answer] = False
    wrong_elsewhere = y.clone()
    wrong_elsewhere[0, outside] = (wrong_elsewhere[0, outside] + 1) % OPS_VOCAB.size
    assert answer_accuracy(x, y, wrong_elsewhere, OPS_VOCAB) == (2, 2)

    # Both answers wrong, in a batch of two rows: counts add up across rows.
    both_wrong = wrong_elsewhere.clone()
    both_wrong[0, [max_answer[0], sum_answer[1]]] += 1
    two_rows = answer_accuracy(
        x.repeat(2, 1), y.repeat(2, 1), torch.cat([y, both_wrong]), OPS_VOCAB
    )
    assert two_rows == (2, 4)


@pytest.mark.parametrize(
    "text",
    [
        "=5\nmax(1,2",  # the '=' is the first input
        "x(1,2)=2\nmin(",  # the question's start is before the window
        "max(1,2)=2\nmin(",  # the window cannot tell that its first character starts a line
    ],
)
def test_answer_accuracy_does_not_score_a_question_cut_by_the_window(text: str) -> None:
    x, y = _window(text, OPS_VOCAB)
    assert answer_accuracy(x, y, y, OPS_VOCAB) == (0, 0)


def test_answer_accuracy_scores_a_question_right_after_the_first_newline() -> None:
    x, y = _window("\nmax(1,2)=2\nmin(", OPS_VOCAB)
    assert answer_accuracy(x, y, y, OPS_VOCAB) == (1, 1)
    wrong = y.clone()
    wrong[0, len("\nmax(1,2)")] = OPS_VOCAB.index("4")  # the target after '='
    assert answer_accuracy(x, y, wrong, OPS_VOCAB) == (0, 1)


def test_answer_accuracy_without_equals_in_the_vocabulary_is_zero_of_zero() -> None:
    vocab = CharVocab.from_text("ab\n")
    x, y = _window("ab\nab\n", vocab)
    assert answer_accuracy(x, y, y, vocab) == (0, 0)


def _answers_by_loop(window: str, predicted: str) -> tuple[int, int]:
    """Reference: each newline target whose line's last '=' and start are in the window."""
    correct = total = 0
    for end in range(1, len(window)):
        if window[end] != "\n":
            continue
        start = end - 1
        while start >= 0 and window[start] not in "=\n":
            start -= 1
        if start < 0 or window[start] != "=":
            continue
        if window.rfind("\n", 0, start) < 0:
            continue  # the line starts before the window: its question is cut
        total += 1
        # The target at position t is window[t + 1]; the answer covers t = start .. end - 1.
        correct += all(predicted[t] == window[t + 1] for t in range(start, end))
    return correct, total


def test_answer_accuracy_agrees_with_a_loop_on_random_windows() -> None:
    rng = random.Random(5)
    text = corpora.ops_text(300, 1, 4, seed=9)
    vocab = CharVocab.from_text(text)
    ids = torch.tensor(vocab.encode(text))
    starts = torch.tensor([rng.randrange(len(text) - 41) for _ in range(64)])
    x, y = batch_from(ids, starts, block_size=40)
    predictions = y.clone()
    flips = torch.rand(y.shape, generator=torch.Generator().manual_seed(0)) < 0.03
    predictions[flips] = (predictions[flips] + 1) % vocab.size
    expected = [0, 0]
    for row in range(len(x)):
        window = vocab.decode(x[row]) + vocab.decode(y[row, -1:])
        correct, total = _answers_by_loop(window, vocab.decode(predictions[row]))
        expected[0] += correct
        expected[1] += total
    assert answer_accuracy(x, y, predictions, vocab) == tuple(expected)
    assert 0 < expected[0] < expected[1]  # the flips hit some answers and missed others


# ---------------------------------------------------------------- `python -m blockviz data`


def test_cli_prints_statistics_and_a_sample(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["data", "--dataset", "ops", "--ops_examples", "50", "--sample_chars", "30"]
    assert cli.main([*argv, "--block_size", "16"]) == 0
    out = capsys.readouterr().out
    text = corpora.ops_text(50, 2, 5, 0)
    assert f"characters  {len(text):,}" in out
    assert f"vocabulary  {len(set(text))} symbols" in out
    assert hashlib.sha256(text.encode()).hexdigest() in out
    assert text[:30] in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "nope"], "neither a built-in corpus"),
        (["--dataset", "ops", "--ops_examples", "10", "--block_size", "500"], "at least"),
        (["--val_fraction", "0.9"], "val_fraction"),
        (["--sample_chars", "-1"], "--sample_chars"),
    ],
)
def test_cli_bad_input_is_one_line_and_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["data", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.skipif(
    not SHARED_SHAKESPEARE.is_file(), reason=f"{SHARED_SHAKESPEARE} is not on this machine"
)
def test_tiny_shakespeare_file_has_its_known_size_and_symbols() -> None:
    corpus = load_corpus(DataConfig(dataset=str(SHARED_SHAKESPEARE)))
    assert len(corpus.text) == 1_115_394
    assert CharVocab.from_text(corpus.text).size == 65
