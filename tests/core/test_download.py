"""Downloads into the cache, against a real HTTP server on 127.0.0.1 (no outside network)."""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from blockviz import cli
from blockviz.core.config_train import DataConfig
from blockviz.core.corpora import SHAKESPEARE_BYTES, SHAKESPEARE_FILE, load_corpus
from blockviz.core.download import cache_dir, download
from blockviz.core.vocab import CharVocab, DataError

BODY = b"To be, or not to be, that is the question:\n" * 40
SHA = hashlib.sha256(BODY).hexdigest()
SHARED_SHAKESPEARE = Path("/work/shared/data/tinyshakespeare.txt")


class LocalServer:
    """Serves `routes` {path: (status, body, content_length or None)} and counts requests."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, bytes, int | None]] = {}
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                status, body, length = server.routes.get(self.path, (404, b"no such file", None))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body)  # HTTP/1.0: the connection closes after the body

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll interval keeps shutdown (once per test) from costing half a second.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}{path}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[LocalServer]:
    running = LocalServer()
    yield running
    running.stop()


def _dest() -> Path:
    return cache_dir() / "hamlet.txt"


def _cache_files() -> list[str]:
    return sorted(p.name for p in cache_dir().iterdir()) if cache_dir().exists() else []


def test_download_writes_verified_file_and_reports_progress(server: LocalServer) -> None:
    server.routes["/hamlet.txt"] = (200, BODY, None)
    seen: list[tuple[int, int | None]] = []
    path = download(
        server.url("/hamlet.txt"),
        _dest(),
        SHA,
        len(BODY),
        progress=lambda done, total: seen.append((done, total)),
        timeout=5,
    )
    assert path == _dest()
    assert path.read_bytes() == BODY
    assert _cache_files() == ["hamlet.txt"]  # no temporary file left next to it
    assert seen[0] == (0, len(BODY)) and seen[-1] == (len(BODY), len(BODY))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_cached_file_is_reused_without_network(server: LocalServer) -> None:
    server.routes["/hamlet.txt"] = (200, BODY, None)
    download(server.url("/hamlet.txt"), _dest(), SHA, len(BODY), timeout=5)
    assert len(server.requests) == 1
    again = download(server.url("/hamlet.txt"), _dest(), SHA, len(BODY), timeout=5)
    assert again.read_bytes() == BODY
    assert len(server.requests) == 1
    server.stop()  # with the server gone, only the cache can answer
    assert download(server.url("/hamlet.txt"), _dest(), SHA, len(BODY), timeout=5) == _dest()


def test_damaged_cached_file_is_downloaded_again(server: LocalServer) -> None:
    server.routes["/hamlet.txt"] = (200, BODY, None)
    _dest().parent.mkdir(parents=True)
    _dest().write_bytes(BODY[:-1] + b"?")  # right size, wrong content
    download(server.url("/hamlet.txt"), _dest(), SHA, len(BODY), timeout=5)
    assert _dest().read_bytes() == BODY
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ((404, b"gone", None), "HTTP 404"),
        ((500, b"oops", None), "HTTP 500"),
        ((200, BODY[:100], len(BODY)), f"ended after 100 of {len(BODY):,} bytes (truncated)"),
        ((200, BODY[:100], None), f"ended after 100 of {len(BODY):,} bytes (truncated)"),
        ((200, BODY.upper(), None), f"expected {SHA}"),
        ((200, BODY + b"more", None), "more than the expected"),
    ],
    ids=["404", "500", "short-body", "short-file", "wrong-checksum", "too-long"],
)
def test_failed_download_names_url_and_cache_and_leaves_nothing(
    server: LocalServer, route: tuple[int, bytes, int | None], message: str
) -> None:
    server.routes["/hamlet.txt"] = route
    url = server.url("/hamlet.txt")
    with pytest.raises(DataError) as caught:
        download(url, _dest(), SHA, len(BODY), timeout=5)
    text = str(caught.value)
    assert message in text
    assert url in text and str(_dest()) in text
    assert f"{len(BODY):,} bytes with SHA-256 {SHA}" in text  # what to place there by hand
    assert _cache_files() == []


def test_unreachable_server_is_a_clear_error() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/hamlet.txt"
    with pytest.raises(DataError, match="no connection") as caught:
        download(url, _dest(), SHA, len(BODY), timeout=5)
    assert url in str(caught.value)
    assert _cache_files() == []


def test_interrupted_download_leaves_no_partial_file(server: LocalServer) -> None:
    server.routes["/hamlet.txt"] = (200, BODY, None)

    def interrupt(done: int, total: int | None) -> None:
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        download(server.url("/hamlet.txt"), _dest(), SHA, len(BODY), progress=interrupt)
    assert _cache_files() == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"BLOCKVIZ_CACHE": "/a/b", "XDG_CACHE_HOME": "/x"}, "/a/b"),
        ({"XDG_CACHE_HOME": "/x"}, "/x/blockviz"),
        ({"HOME": "/home/u"}, "/home/u/.cache/blockviz"),
    ],
)
def test_cache_dir_precedence(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("BLOCKVIZ_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cache_dir() == Path(expected)


def test_shakespeare_offline_error_says_how_to_place_the_file(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = server.url("/input.txt")  # answers 404
    monkeypatch.setenv("BLOCKVIZ_SHAKESPEARE_URL", url)
    with pytest.raises(DataError) as caught:
        load_corpus(DataConfig(dataset="shakespeare"))
    text = str(caught.value)
    assert url in text
    assert str(cache_dir() / SHAKESPEARE_FILE) in text
    assert f"{SHAKESPEARE_BYTES:,} bytes" in text
    assert _cache_files() == []


@pytest.mark.skipif(
    not SHARED_SHAKESPEARE.is_file(), reason=f"{SHARED_SHAKESPEARE} is not on this machine"
)
def test_shakespeare_downloads_once_then_loads_from_the_cache(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server.routes["/input.txt"] = (200, SHARED_SHAKESPEARE.read_bytes(), None)
    monkeypatch.setenv("BLOCKVIZ_SHAKESPEARE_URL", server.url("/input.txt"))
    assert cli.main(["data", "--dataset", "shakespeare", "--sample_chars", "0"]) == 0
    captured = capsys.readouterr()
    assert "100%" in captured.err  # the download showed its progress
    assert "characters  1,115,394" in captured.out
    assert "vocabulary  65 symbols" in captured.out
    corpus = load_corpus(DataConfig(dataset="shakespeare"))
    assert len(server.requests) == 1
    assert len(corpus.text) == 1_115_394
    assert CharVocab.from_text(corpus.text).size == 65
    assert _cache_files() == [SHAKESPEARE_FILE]


@pytest.mark.skipif(
    not SHARED_SHAKESPEARE.is_file(), reason=f"{SHARED_SHAKESPEARE} is not on this machine"
)
def test_a_training_run_shows_the_first_download(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server.routes["/input.txt"] = (200, SHARED_SHAKESPEARE.read_bytes(), None)
    monkeypatch.setenv("BLOCKVIZ_SHAKESPEARE_URL", server.url("/input.txt"))
    flags = ["--preset", "tiny", "--max_steps", "2", "--warmup_steps", "1"]
    flags += ["--accelerator", "cpu", "--no_progress"]
    assert cli.main(["train", "--dataset", "shakespeare", *flags]) == 0
    assert "downloading: 100%" in capsys.readouterr().err
    assert cli.main(["train", "--dataset", "shakespeare", *flags]) == 0
    assert "downloading" not in capsys.readouterr().err  # the second run reads the cache
    assert len(server.requests) == 1
