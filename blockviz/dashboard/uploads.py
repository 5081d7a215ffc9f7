"""Uploaded text: checked, saved under its content hash, and the sidebar's uploader."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from blockviz.core import corpora
from blockviz.core.files import atomic_write
from blockviz.core.vocab import CharVocab, DataError
from blockviz.dashboard.config_fields import DATASET_NOTES, UPLOAD_CHOICE
from blockviz.dashboard.store_access import store_workspace

UPLOAD_KEY = "cfg.upload"  # the file_uploader widget (its value cannot be set by code)
UPLOAD_INFO_KEY = "upload_info"  # the accepted upload (survives the uploader's reset)
UPLOAD_TYPES = ("txt", "md", "py", "csv")


@dataclass(frozen=True)
class UploadInfo:
    """An accepted upload: where it was saved and what it holds."""

    name: str  # the user's file name, for display only (never part of a path)
    path: str
    n_chars: int
    vocab_size: int
    sha256: str


def uploads_dir() -> Path:
    """<workspace>/uploads: accepted uploads, named by content hash."""
    return store_workspace() / "uploads"


def accept_upload(data: bytes, display_name: str) -> UploadInfo:
    """Check uploaded bytes (UTF-8, non-empty, not binary, size, vocabulary) and save them.

    Raises DataError with a message for the user; nothing is written then. The
    saved file's name is the content's SHA-256 prefix, never the user's file name.
    """
    text = corpora.check_text_bytes(data, display_name)
    digest = hashlib.sha256(data).hexdigest()
    folder = uploads_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest[:16]}.txt"
    if not path.exists():
        atomic_write(path, text)  # a concurrent reader never sees half a file
    vocab_size = CharVocab.from_text(text).size
    return UploadInfo(display_name, str(path), len(text), vocab_size, digest)


def upload_widget() -> str | None:
    """The uploader; returns an error message for a refused upload."""
    uploaded = st.file_uploader(
        "Text file", type=list(UPLOAD_TYPES), key=UPLOAD_KEY, help=DATASET_NOTES[UPLOAD_CHOICE]
    )
    if uploaded is None:
        return None
    info: UploadInfo | None = st.session_state.get(UPLOAD_INFO_KEY)
    if uploaded.size > corpora.MAX_TEXT_BYTES:
        st.session_state.pop(UPLOAD_INFO_KEY, None)
        return (
            f"{uploaded.name} is {uploaded.size:,} bytes, larger than the "
            f"{corpora.MAX_TEXT_BYTES // 2**20} MiB limit; upload an excerpt of it"
        )
    data = uploaded.getvalue()
    if info is not None and info.sha256 == hashlib.sha256(data).hexdigest():
        return None  # the same file as last run: already checked and saved
    try:
        st.session_state[UPLOAD_INFO_KEY] = accept_upload(data, uploaded.name)
    except (DataError, OSError) as exc:
        # A refused upload must not leave an older file silently in use.
        st.session_state.pop(UPLOAD_INFO_KEY, None)
        return str(exc)
    return None
