"""Where the characters come from: built-in corpora, a download cache, your own text, vocab.

Nothing here imports torch, so the UI can check an uploaded file and show dataset
statistics without it; the vocabulary and the input checks are `blockviz.core.vocab`, the
download cache `blockviz.core.download`, the tensors `blockviz.training.data`.
"""

from __future__ import annotations

import codecs
import hashlib
import math
import os
import random
import re
import stat
import sys
import sysconfig
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from blockviz.core.config_train import DataConfig
from blockviz.core.download import Progress, cache_dir, download
from blockviz.core.vocab import CharVocab, DataError, check_vocab_size, unigram_nats

BUILTIN = ("pydocs", "pycode", "shakespeare", "ops")

# Streamlit's upload limit is 20 MB too; a character model on a CPU needs far less text.
MAX_TEXT_BYTES = 20 * 1024 * 1024
# The whole stdlib is ~20M characters; 2M is four times pydocs and still encodes in a blink.
PYCODE_MAX_CHARS = 2_000_000

SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_BYTES = 1_115_394  # plain ASCII, so also the number of characters
SHAKESPEARE_FILE = "tinyshakespeare.txt"
SHAKESPEARE_VOCAB_SIZE = 65  # distinct characters of the file the SHA-256 pins

OPS = ("max", "min", "first", "last", "sum")


@dataclass
class Corpus:
    """The whole text of one dataset and where it came from."""

    name: str
    source: str
    text: str


def load_corpus(cfg: DataConfig, progress: Progress | None = None) -> Corpus:
    """The text of `cfg.dataset`: a built-in corpus by name, otherwise a UTF-8 file path."""
    cfg.validate()
    name = cfg.dataset
    if name == "pydocs":
        return _pydocs()
    if name == "pycode":
        return _pycode()
    if name == "shakespeare":
        return _shakespeare(progress)
    if name == "ops":
        source = (
            f"synthetic ops task: {cfg.ops_examples} lines, {cfg.ops_min_args}-"
            f"{cfg.ops_max_args} arguments, seed {cfg.ops_seed}"
        )
        text = ops_text(cfg.ops_examples, cfg.ops_min_args, cfg.ops_max_args, cfg.ops_seed)
        return Corpus("ops", source, text)
    check_dataset(name)
    path = Path(name).expanduser()
    return Corpus(path.name, str(path.resolve()), read_text_file(path))


def check_dataset(name: str) -> None:
    """DataError when `name` is neither a built-in corpus nor an existing file; reads
    nothing, so a command checks it before anything slow."""
    if name in BUILTIN:
        return
    path = Path(name).expanduser()
    try:
        exists = path.exists()
    except OSError:  # a name too long for a path, say: no file has it
        exists = False
    if not exists:
        shown = repr(name) if len(name) <= 200 else f"{name[:60]!r}… ({len(name):,} characters)"
        raise DataError(
            f"dataset {shown} is neither a built-in corpus nor an existing file; "
            f"choose one of {', '.join(BUILTIN)} or give the path of a UTF-8 text file"
        )


# ---------------------------------------------------------------- files and uploads


def read_text_file(path: str | os.PathLike[str]) -> str:
    """The text of a UTF-8 file, after the same checks as an upload (see check_text_bytes)."""
    file = Path(path).expanduser()
    label = str(file)
    data = read_regular_file(file, label, MAX_TEXT_BYTES, advice="use an excerpt of it")
    return check_text_bytes(data, label)


def _not_regular(mode: int) -> str | None:
    """What a file that is not a regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((kind for test, kind in kinds if test(mode)), "a special file")


def read_regular_file(
    path: str | os.PathLike[str],
    label: str,
    max_bytes: int,
    *,
    want: str = "a UTF-8 text file",
    advice: str = "give a smaller file",
) -> bytes:
    """The bytes of a regular file of at most `max_bytes`, or DataError naming `label`.

    A FIFO, a device, a socket or a directory is refused from its stat, before any open:
    reading a FIFO waits for a writer forever and /dev/zero never ends. The open itself is
    non-blocking and checked again, in case the path changed in between.
    """
    where = f"give the path of {want}"
    try:
        status = os.stat(path)
    except FileNotFoundError:
        raise DataError(
            f"{label}: no such file; check the path (relative to {Path.cwd()})"
        ) from None
    except OSError as exc:
        raise DataError(f"{label}: cannot read it ({exc.strerror}); {where}") from None
    kind = _not_regular(status.st_mode)
    if kind is not None:
        raise DataError(f"{label} is {kind}, not a regular file; {where}")
    # Refuse before reading so a multi-gigabyte file never lands in memory.
    if status.st_size > max_bytes:
        raise _too_large(label, status.st_size, max_bytes, advice)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        raise DataError(f"{label}: cannot read it ({exc.strerror}); {where}") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            kind = _not_regular(os.fstat(fh.fileno()).st_mode)
            if kind is not None:
                raise DataError(f"{label} is {kind}, not a regular file; {where}")
            data = fh.read(max_bytes + 1)  # a file that grew since the stat stops here
    except OSError as exc:
        raise DataError(f"{label}: cannot read it ({exc.strerror}); {where}") from None
    if len(data) > max_bytes:
        raise _too_large(label, len(data), max_bytes, advice)
    return data


def check_text_bytes(data: bytes, label: str) -> str:
    """Decode bytes as UTF-8 text, refusing empty, binary, non-UTF-8 and too-large data."""
    if not data:
        raise DataError(f"{label} is empty; a dataset needs text to train on")
    if len(data) > MAX_TEXT_BYTES:
        raise _too_large(label, len(data), MAX_TEXT_BYTES, "use an excerpt of it")
    # Valid UTF-8 may hold NUL, but no text file does; it is the surest sign of binary data.
    nul = data.find(b"\x00")
    if nul >= 0:
        raise DataError(
            f"{label} looks binary (a NUL byte at byte offset {nul}); give a UTF-8 text file"
        )
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = bom + exc.start
        raise DataError(
            f"{label} is not UTF-8 text (byte 0x{data[offset]:02x} at byte offset {offset} "
            "does not decode); save it as UTF-8 or choose another file"
        ) from None
    # Windows line endings would add a '\r' symbol that the model must learn to emit.
    text = text.replace("\r\n", "\n")
    if not text:
        raise DataError(f"{label} holds only a byte-order mark; a dataset needs text to train on")
    check_vocab_size(text, label)
    return text


def _too_large(label: str, size: int, max_bytes: int, advice: str) -> DataError:
    mib = f" ({max_bytes / 2**20:g} MiB)" if max_bytes >= 2**20 else ""
    return DataError(
        f"{label} is {size:,} bytes, larger than the {max_bytes:,}-byte limit{mib}; {advice}"
    )


# ---------------------------------------------------------------- built-in corpora


def _pydocs() -> Corpus:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise DataError(
            "this Python has no pydoc_data module, so the pydocs corpus is unavailable; "
            "choose another dataset (pycode, ops or a text file)"
        ) from None
    # Sorted keys: the same Python version always yields the same text (and fingerprint).
    text = "\n".join(topics[key] for key in sorted(topics))
    version = ".".join(map(str, sys.version_info[:3]))
    return Corpus("pydocs", f"pydoc_data.topics of Python {version}", text)


def pycode_files(root: Path) -> list[Path]:
    """Stdlib `.py` files under root, sorted by relative path, without tests and site-packages."""
    skip_dirs = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip_dirs and not d.startswith("config-")]
        files.extend(
            Path(dirpath, name)
            for name in filenames
            if name.endswith(".py") and not name.startswith("test_")
        )
    return sorted(files, key=lambda file: file.relative_to(root).as_posix())


def _pycode() -> Corpus:
    root = Path(sysconfig.get_path("stdlib"))
    chunks: list[str] = []
    total = 0
    for file in pycode_files(root):
        try:
            source = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # a stray non-UTF-8 or unreadable file is not worth failing over
        if not source.endswith("\n"):
            source += "\n"
        chunk = f"# file: {file.relative_to(root).as_posix()}\n{source}"
        # Whole files only: the cut is at a file boundary, so the corpus is valid Python.
        if total + len(chunk) > PYCODE_MAX_CHARS:
            break
        chunks.append(chunk)
        total += len(chunk)
    if not chunks:
        raise DataError(
            f"no standard-library .py files found under {root}; choose another dataset "
            "(pydocs, ops or a text file)"
        )
    version = ".".join(map(str, sys.version_info[:3]))
    source = f"{len(chunks)} standard-library files of Python {version} at {root}"
    return Corpus("pycode", source, "".join(chunks))


def _shakespeare(progress: Progress | None) -> Corpus:
    url = os.environ.get("BLOCKVIZ_SHAKESPEARE_URL") or SHAKESPEARE_URL
    path = download(
        url,
        cache_dir() / SHAKESPEARE_FILE,
        SHAKESPEARE_SHA256,
        SHAKESPEARE_BYTES,
        progress,
    )
    return Corpus("shakespeare", f"{url} (cached at {path})", read_text_file(path))


def ops_line(op: str, args: Sequence[int]) -> str:
    """One task line without its newline, e.g. `max(3,9,1)=9` or `sum(3,9,1)%10=3`."""
    joined = ",".join(map(str, args))
    if op == "max":
        return f"max({joined})={max(args)}"
    if op == "min":
        return f"min({joined})={min(args)}"
    if op == "first":
        return f"first({joined})={args[0]}"
    if op == "last":
        return f"last({joined})={args[-1]}"
    if op == "sum":
        return f"sum({joined})%10={sum(args) % 10}"
    raise DataError(f"ops: unknown operation {op!r}; choose one of {', '.join(OPS)}")


def ops_distinct_lines(min_args: int, max_args: int) -> int:
    """How many different task lines exist with min_args..max_args digit arguments."""
    return len(OPS) * sum(10**k for k in range(min_args, max_args + 1))


def ops_text(n_examples: int, min_args: int, max_args: int, seed: int) -> str:
    """`n_examples` different newline-terminated task lines drawn from `random.Random(seed)`.

    Each line is one example and appears once: the contiguous train/val split then keeps
    every complete validation line out of training (with repeats, all 2-argument lines of
    the defaults were in both). A draw that repeats an earlier line is drawn again, so
    short lines, of which there are few, are rarer than the uniform draw would make them;
    the lines are then shuffled so that both splits hold the same mix.
    """
    available = ops_distinct_lines(min_args, max_args)
    if n_examples > available:
        raise DataError(
            f"ops: {n_examples:,} different lines were asked for, but only {available:,} "
            f"exist with {min_args}-{max_args} arguments; lower ops_examples or allow "
            "more arguments"
        )
    rng = random.Random(seed)
    seen: dict[str, None] = {}  # insertion-ordered set: reproducible from the seed
    while len(seen) < n_examples:
        op = rng.choice(OPS)
        args = [rng.randrange(10) for _ in range(rng.randint(min_args, max_args))]
        seen.setdefault(ops_line(op, args) + "\n")
    # Shuffled: short lines run out early in the draw order, and validation is the text's
    # end, so without this it would hold long lines only.
    lines = list(seen)
    rng.shuffle(lines)
    return "".join(lines)


_QUESTION = re.compile(r"(\w+)\(([0-9,]*)\)(?:%10)?=")


def ops_baseline_table(text: str) -> dict[str, str]:
    """Per op, the answer its complete lines in `text` give most often (ties: the smallest).

    The trivial baseline guesses this for max, min and sum; `text` is the training split.
    """
    counts: dict[str, Counter[str]] = {}
    for line in text.split("\n")[:-1]:  # the last piece may be cut by the split
        question, equals, answer = line.rpartition("=")
        match = _QUESTION.fullmatch(question + equals)
        if match and answer:
            counts.setdefault(match.group(1), Counter())[answer] += 1
    return {op: min(seen, key=lambda a: (-seen[a], a)) for op, seen in counts.items()}


def ops_baseline_answer(question: str, table: dict[str, str]) -> str | None:
    """The trivial baseline's answer to a question such as `first(3,9)=`; None if it cannot.

    first and last copy their argument (no arithmetic needed); any other op gets its most
    frequent training answer from `table` (see ops_baseline_table).
    """
    match = _QUESTION.fullmatch(question)
    if match is None or not match.group(2):
        return None
    op, args = match.group(1), match.group(2).split(",")
    if op == "first":
        return args[0]
    if op == "last":
        return args[-1]
    return table.get(op)


# ---------------------------------------------------------------- downloads and the cache


def fingerprint(corpus: Corpus, vocab: CharVocab, n_train: int, n_val: int) -> dict[str, object]:
    """What a run records about its data: name, source, sizes, the SHA-256 of the text, and
    two reference losses: `unigram_nats` of the training split and `init_loss` = ln(vocab
    size), the loss of predicting every character equally likely."""
    return {
        "unigram_nats": round(unigram_nats(corpus.text[:n_train]), 6),
        "init_loss": round(math.log(vocab.size), 6) if vocab.size > 0 else 0.0,
        "name": corpus.name,
        "source": corpus.source,
        "n_chars": len(corpus.text),
        "vocab_size": vocab.size,
        "n_train": n_train,
        "n_val": n_val,
        "sha256": hashlib.sha256(corpus.text.encode("utf-8")).hexdigest(),
    }
