"""Run tags and notes: the rules (core.tags), the store API, and the version 2 upgrade."""

from __future__ import annotations

import sqlite3

import pytest

from blockviz.core.tags import NOTES_MAX, TAG_MAX, TAGS_MAX, TagError, clean_notes, parse_tags
from blockviz.store import RunStore, StoreError
from blockviz.store.schema import SCHEMA_VERSION


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("post-ln, lr:3e-3 ,post-ln", ("post-ln", "lr:3e-3")),
        (["a", " b ", "", "a"], ("a", "b")),
        ("", ()),
        (None, ()),
        (",,", ()),
        ("Ablation,ablation", ("Ablation", "ablation")),  # case is kept, not folded
    ],
)
def test_parse_tags_splits_strips_and_deduplicates(given, expected):
    assert parse_tags(given) == expected


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("two words", "a space"),
        ("<b>x</b>", "'<'"),
        ("a" * (TAG_MAX + 1), f"longer than {TAG_MAX}"),
        (",".join(f"t{i}" for i in range(TAGS_MAX + 1)), f"at most {TAGS_MAX}"),
        ([3], "not text"),
    ],
)
def test_a_bad_tag_is_refused_with_the_reason(given, named):
    with pytest.raises(TagError, match=named):
        parse_tags(given)


def test_notes_drop_control_characters_keep_lines_and_are_bounded():
    assert clean_notes("  first\x00 line\x1b[31m\n\tsecond  ") == "first line[31m\n\tsecond"
    assert clean_notes(None) == ""
    assert len(clean_notes("x" * NOTES_MAX)) == NOTES_MAX
    with pytest.raises(TagError, match="at most"):
        clean_notes("x" * (NOTES_MAX + 1))


def test_store_keeps_tags_and_notes_and_lists_them(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        tagged = store.create_run("a", "{}", tags="x, y", notes="why I ran it")
        plain = store.create_run("b", "{}")
        assert store.get_run(tagged).tags == ("x", "y")
        assert store.get_run(tagged).notes == "why I ran it"
        assert store.get_run(plain).tags is None
        assert store.set_tags(plain, ["z", "z"]) == ("z",)
        assert store.set_notes(tagged, " new\x07 ") == "new"
        frame = store.runs_frame()
        assert frame.set_index("name")["tags"].to_dict() == {"a": "x, y", "b": "z"}
        assert frame.set_index("name")["notes"].to_dict() == {"a": "new", "b": ""}
        assert store.set_tags(tagged, "") == ()
        assert store.runs_frame().set_index("name")["tags"]["a"] == ""


def test_store_refuses_bad_tags_as_a_store_error_and_keeps_the_old_ones(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        run = store.create_run("a", "{}", tags="keep")
        with pytest.raises(StoreError, match="a space"):
            store.set_tags(run, "bad tag")
        with pytest.raises(StoreError, match="a space"):
            store.create_run("b", "{}", tags="bad tag")
        assert store.get_run(run).tags == ("keep",)
        assert list(store.runs_frame()["name"]) == ["a"]


def test_a_version_2_store_gains_tags_and_notes_when_opened_for_writing(tmp_path):
    path = tmp_path / "runs.db"
    with RunStore(path) as store:
        old = store.create_run("old", "{}", status="completed")
    with sqlite3.connect(path) as conn:  # what version 2 wrote
        conn.execute("ALTER TABLE runs DROP COLUMN tags")
        conn.execute("ALTER TABLE runs DROP COLUMN notes")
        for column in ("study_id", "variant", "seed"):
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        conn.execute("DROP TABLE studies")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    with RunStore(path, readonly=True) as reader:  # read as it is
        assert reader.get_run(old).tags is None
        assert reader.runs_frame()["tags"].tolist() == [""]
    with RunStore(path) as store:
        assert store.set_tags(old, "kept") == ("kept",)
        assert store.get_run(old).name == "old"
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert int(version[0]) == SCHEMA_VERSION
