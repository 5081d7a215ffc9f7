"""Where the characters come from: built-in corpora, a download cache, your own text, vocab.

Nothing here imports torch, so the UI can check an uploaded file and show dataset
statistics without it; `blockviz.training.data` re-exports every name and adds the tensors.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import http.client
import json
import os
import random
import stat
import sys
import sysconfig
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from blockviz.core.config import MAX_VOCAB, DataConfig, check_int, from_dict

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

Progress = Callable[[int, int | None], None]


class DataError(ValueError):
    """A dataset, file or download that cannot be used; the message says why and what to do."""


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
    return Corpus(path.name, str(path.resolve()), read_text_file(path))


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


def check_vocab_size(text: str, label: str) -> int:
    """The number of distinct characters of `text`; DataError past MAX_VOCAB (10,000)."""
    size = len(set(text))
    if size > MAX_VOCAB:
        raise DataError(
            f"{label} has {size:,} distinct characters, more than the {MAX_VOCAB:,} a "
            "character vocabulary may hold; use text in fewer scripts, or replace rare "
            "symbols before training"
        )
    return size


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


def ops_text(n_examples: int, min_args: int, max_args: int, seed: int) -> str:
    """`n_examples` newline-terminated task lines drawn from `random.Random(seed)`."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_examples):
        op = rng.choice(OPS)
        args = [rng.randrange(10) for _ in range(rng.randint(min_args, max_args))]
        lines.append(ops_line(op, args) + "\n")
    return "".join(lines)


# ---------------------------------------------------------------- downloads and the cache


def cache_dir() -> Path:
    """Downloads live in $BLOCKVIZ_CACHE, else $XDG_CACHE_HOME/blockviz, else ~/.cache/blockviz."""
    if os.environ.get("BLOCKVIZ_CACHE"):
        return Path(os.environ["BLOCKVIZ_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "blockviz"
    return Path.home() / ".cache" / "blockviz"


class _DownloadFailed(Exception):
    """Why one download attempt failed, in words; turned into a DataError by `download`."""


def download(
    url: str,
    dest: Path,
    sha256: str,
    size: int,
    progress: Progress | None = None,
    timeout: float = 30,
) -> Path:
    """`dest`, fetched from `url` unless a valid copy is there; verified, written atomically."""
    dest = Path(dest)
    if _file_matches(dest, sha256, size):
        return dest
    by_hand = (
        f"To work offline, download that URL another way and save it as {dest} "
        f"(it must be {size:,} bytes with SHA-256 {sha256})"
    )
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    except OSError as exc:
        raise DataError(
            f"cannot write to the cache directory {dest.parent} ({exc.strerror}); "
            "set BLOCKVIZ_CACHE to a writable directory"
        ) from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            done, digest = _fetch(url, out, size, progress, timeout)
        if done != size:
            raise _DownloadFailed(f"the body ended after {done:,} of {size:,} bytes (truncated)")
        if digest != sha256:
            raise _DownloadFailed(f"its SHA-256 is {digest}, expected {sha256}")
        os.replace(tmp, dest)  # atomic: readers see no file or the whole, verified file
    except _DownloadFailed as exc:
        tmp.unlink(missing_ok=True)
        raise DataError(f"could not download {url} to {dest}: {exc}. {by_hand}") from None
    except BaseException:
        # Ctrl-C or a full disk: still never leave a partial file in the cache.
        tmp.unlink(missing_ok=True)
        raise
    return dest


def _fetch(
    url: str, out: BinaryIO, size: int, progress: Progress | None, timeout: float
) -> tuple[int, str]:
    """Stream `url` into `out`; return (bytes written, SHA-256 hex). Errors become words."""
    digest = hashlib.sha256()
    done = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if progress:
                progress(0, size)
            while chunk := response.read(1 << 16):
                done += len(chunk)
                # A wrong URL can serve something huge; stop as soon as it is too big.
                if done > size:
                    raise _DownloadFailed(f"the server sent more than the expected {size:,} bytes")
                digest.update(chunk)
                out.write(chunk)
                if progress:
                    progress(done, size)
    except urllib.error.HTTPError as exc:
        raise _DownloadFailed(f"the server answered HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise _DownloadFailed(f"no connection ({exc.reason})") from None
    except TimeoutError:
        raise _DownloadFailed(f"no answer within {timeout:g} s") from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise _DownloadFailed(f"the connection failed ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:  # urllib's answer to a malformed URL
        raise _DownloadFailed(f"not a usable URL ({exc})") from None
    return done, digest.hexdigest()


def _file_matches(path: Path, sha256: str, size: int) -> bool:
    """Whether `path` is a regular file of exactly `size` bytes with this SHA-256."""
    try:
        if not path.is_file() or path.stat().st_size != size:
            return False
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return False
    return digest.hexdigest() == sha256


# ---------------------------------------------------------------- vocabulary


class CharVocab:
    """Characters <-> integer ids; built from a whole corpus and saved with each run as JSON.

    `encode` is strict by default: a character the vocabulary has never seen raises
    DataError naming it. With `replace_unknown=True` each unseen character becomes
    `replacement`: a space when the vocabulary has one, else its first (lowest) symbol.
    """

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        if not chars:
            raise DataError("a vocabulary needs at least one character")
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise DataError("a vocabulary holds single characters only")
        if len(set(chars)) != len(chars):
            raise DataError("a vocabulary lists each character once")
        self.chars: list[str] = chars
        self._ids: dict[str, int] = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        """The sorted set of characters of `text`; DataError past MAX_VOCAB of them."""
        if not text:
            raise DataError("cannot build a vocabulary from empty text")
        check_vocab_size(text, "the text")
        return cls(sorted(set(text)))

    @property
    def size(self) -> int:
        """Number of symbols (the model's vocab_size)."""
        return len(self.chars)

    @property
    def replacement(self) -> str:
        """What `encode(..., replace_unknown=True)` writes for an unseen character."""
        return " " if " " in self._ids else self.chars[0]

    def __contains__(self, char: object) -> bool:
        return char in self._ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharVocab) and other.chars == self.chars

    __hash__ = None  # type: ignore[assignment]  # mutable list inside: not a dict key

    def __repr__(self) -> str:
        return f"CharVocab(size={self.size}, chars={''.join(self.chars)!r})"

    def index(self, char: str) -> int:
        """The id of one character (DataError when unseen)."""
        return self.encode(char)[0]

    def encode(self, text: str, replace_unknown: bool = False) -> list[int]:
        """Ids of each character; unseen ones raise DataError, or map to `replacement`."""
        ids = self._ids
        try:
            return [ids[c] for c in text]
        except KeyError:
            pass
        if replace_unknown:
            fallback = ids[self.replacement]
            return [ids.get(c, fallback) for c in text]
        unknown = [(pos, c) for pos, c in enumerate(text) if c not in ids]
        shown = ", ".join(f"{c!r} at position {pos}" for pos, c in unknown[:5])
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise DataError(
            f"the text has {len(unknown)} character(s) the vocabulary does not know: "
            f"{shown}{more}; the vocabulary has {self.size} symbols. Remove them, or encode with "
            f"replace_unknown=True to write {self.replacement!r} in their place"
        )

    def decode(self, ids: Iterable[int]) -> str:
        """The text of a sequence of ids (a list or a 1-D tensor)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()  # a tensor: one transfer, then plain ints
        ids = list(ids)
        if not all(isinstance(i, int) and 0 <= i < self.size for i in ids):
            raise DataError(
                f"ids to decode must be integers in [0, {self.size - 1}] for this vocabulary"
            )
        return "".join(self.chars[i] for i in ids)

    def to_json(self) -> str:
        """JSON text that `from_json` reads back into an equal vocabulary."""
        return json.dumps({"chars": self.chars})

    @classmethod
    def from_json(cls, text: str) -> CharVocab:
        """A vocabulary saved by `to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"vocabulary JSON does not parse ({exc.msg})") from None
        if not isinstance(data, dict) or not isinstance(data.get("chars"), list):
            raise DataError('vocabulary JSON must be an object {"chars": [...]}')
        return cls(data["chars"])


# ---------------------------------------------------------------- splits and fingerprints


def split_sizes(n_chars: int, val_fraction: float) -> tuple[int, int]:
    """(train, val) lengths of a contiguous split: the last `val_fraction` is validation."""
    n_train = int(n_chars * (1 - val_fraction))
    return n_train, n_chars - n_train


def min_chars(block_size: int, val_fraction: float) -> int:
    """The shortest text whose both splits hold one window of block_size + 1 characters."""
    need = block_size + 1
    # The validation split holds ceil(n * val_fraction) characters, so n must pass
    # (need - 1) / val_fraction; both lengths only grow with n, so walk up from there.
    n = max(need, int((need - 1) / val_fraction) - 1)
    while min(split_sizes(n, val_fraction)) < need:
        n += 1
    return n


def check_split(n_chars: int, val_fraction: float, block_size: int, label: str) -> tuple[int, int]:
    """Split sizes, or DataError saying how many characters `block_size` needs."""
    n_train, n_val = split_sizes(n_chars, val_fraction)
    need = block_size + 1
    if min(n_train, n_val) < need:
        short = "validation" if n_val < need else "training"
        got = n_val if n_val < need else n_train
        raise DataError(
            f"{label} has {n_chars:,} characters, too short for block_size={block_size}: the "
            f"{short} split gets {got:,} but needs at least {need:,} (block_size + 1). Use a text "
            f"of at least {min_chars(block_size, val_fraction):,} characters at "
            f"val_fraction={val_fraction}, or a smaller block_size"
        )
    return n_train, n_val


def fingerprint(corpus: Corpus, vocab: CharVocab, n_train: int, n_val: int) -> dict[str, object]:
    """What a run records about its data: name, source, sizes and the SHA-256 of the text."""
    return {
        "name": corpus.name,
        "source": corpus.source,
        "n_chars": len(corpus.text),
        "vocab_size": vocab.size,
        "n_train": n_train,
        "n_val": n_val,
        "sha256": hashlib.sha256(corpus.text.encode("utf-8")).hexdigest(),
    }


# ---------------------------------------------------------------- `python -m blockviz data`


class DownloadProgress:
    """Percentages on stderr while a download runs; silent when nothing is downloaded."""

    def __init__(self) -> None:
        self.shown = -1

    def __call__(self, done: int, total: int | None) -> None:
        percent = int(100 * done / total) if total else 0
        if percent != self.shown:
            self.shown = percent
            total_text = f"{total:,}" if total else "?"
            print(
                f"\rdownloading: {percent:3d}% ({done:,} / {total_text} bytes)",
                end="",
                file=sys.stderr,
            )

    def finish(self) -> None:
        if self.shown >= 0:
            print(file=sys.stderr)


def _symbols(chars: list[str]) -> str:
    """The vocabulary as one Python string literal, so whitespace and controls are visible."""
    return repr("".join(chars))


def cli_main(args: argparse.Namespace) -> int:
    """`python -m blockviz data`: statistics and a sample of a dataset."""
    from blockviz.cli import config_overrides

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
