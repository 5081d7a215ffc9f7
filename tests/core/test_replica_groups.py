"""Which runs may train as replicas of one batch, how they are grouped, the flags' values."""

from __future__ import annotations

import pytest

from blockviz.core import config as cfg
from blockviz.core import replicas
from tests.helpers import tiny_config


def test_runs_that_differ_only_in_per_replica_fields_share_a_key():
    base = tiny_config()
    other = cfg.replace(
        base,
        seed=9,
        lr=3e-3,
        min_lr=1e-5,
        warmup_steps=1,
        lr_schedule="linear",
        weight_decay=0.0,
        beta1=0.8,
        beta2=0.95,
        grad_clip=0.0,
        z_loss=1e-4,
        init="gpt2",
    )
    assert replicas.batch_key(base) == replicas.batch_key(other)


@pytest.mark.parametrize(
    "field, value",
    [
        ("n_layer", 3),
        ("d_model", 32),
        ("batch_size", 8),
        ("max_steps", 7),
        ("eval_interval", 2),
        ("norm_position", "post"),
        ("residual_scale", 0.5),
        ("dataset", "pycode"),
    ],
)
def test_a_shared_field_that_differs_splits_the_batch(field, value):
    base = tiny_config()
    assert replicas.batch_key(base) != replicas.batch_key(cfg.replace(base, **{field: value}))


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"dropout": 0.1}, "dropout"),
        ({"norm_type": "batchnorm"}, "batchnorm"),
        ({"devices": 2}, "devices"),
    ],
)
def test_configs_that_cannot_batch_say_why(overrides, words):
    assert words in replicas.why_solo(tiny_config(**overrides))
    assert replicas.why_solo(tiny_config()) is None
    assert replicas.why_solo(tiny_config(compile=True)) is None  # the stacked step compiles


def test_a_stored_config_batches_by_its_key_unless_it_trains_alone_or_is_unreadable():
    config = tiny_config()
    assert replicas.stored_batch_key(config.to_json()) == replicas.batch_key(config)
    assert replicas.stored_batch_key(tiny_config(dropout=0.1).to_json()) is None
    assert replicas.stored_batch_key("{not json") is None
    assert replicas.stored_batch_key(None) is None


def test_grouping_keeps_order_bounds_size_and_leaves_solo_configs_alone():
    a, b = tiny_config(), tiny_config(n_layer=3)
    solo = tiny_config(dropout=0.1)
    items = [(1, a), (2, b), (3, a), (4, solo), (5, a), (6, b), (7, a)]
    assert replicas.group(items, limit=2) == [[1, 3], [2, 6], [4], [5, 7]]
    assert replicas.group(items, limit=8) == [[1, 3, 5, 7], [2, 6], [4]]
    assert replicas.group(items, limit=1) == [[i] for i, _ in items]
    with pytest.raises(ValueError):
        replicas.group(items, limit=0)


@pytest.mark.parametrize(
    "count, limit, sizes",
    [(14, 8, [7, 7]), (9, 8, [5, 4]), (8, 8, [8]), (17, 8, [6, 6, 5]), (3, 1, [1, 1, 1])],
)
def test_a_shape_splits_into_even_batches(count, limit, sizes):
    items = [(i, tiny_config()) for i in range(count)]
    assert [len(b) for b in replicas.group(items, limit)] == sizes
    assert replicas.even_batch(count, limit) == sizes[0]


@pytest.mark.parametrize(
    "text, seeds",
    [("0,1,2", [0, 1, 2]), ("3", [3]), ("0-3", [0, 1, 2, 3]), ("0,5-7", [0, 5, 6, 7])],
)
def test_seed_lists(text, seeds):
    assert replicas.parse_seeds(text) == seeds


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("1,,2", "empty"),
        ("a", "not a seed"),
        ("3-1", "backwards"),
        ("0-2,1", "names seed 1 twice"),
        ("0-300", "more than 256"),
    ],
)
def test_bad_seed_lists_say_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words):
        replicas.parse_seeds(text)


def test_replica_limits():
    assert replicas.parse_replicas("off") == 1
    assert replicas.parse_replicas("OFF") == 1
    assert replicas.parse_replicas("4") == 4
    assert replicas.parse_replicas("256") == 256
    for bad in ("0", "257", "many"):
        with pytest.raises(ValueError):
            replicas.parse_replicas(bad)


def test_batch_file_round_trip_and_damage(tmp_path):
    replicas.write_batch_file(tmp_path, [4, 5, 6], 1)
    assert replicas.read_batch_file(tmp_path) == {"runs": [4, 5, 6], "index": 1, "leader": 4}
    replicas.write_batch_file(tmp_path, [4, 5, 6], 1, leader=5)
    assert replicas.read_batch_file(tmp_path)["leader"] == 5
    assert replicas.checkpoint_path(tmp_path, {5: tmp_path / "five"}.get) == (
        tmp_path / "five" / "checkpoints" / "last.ckpt"
    )
    replicas.write_batch_file(tmp_path, [4, 5, 6], 1)
    folders = {4: tmp_path / "four"}
    assert (
        replicas.checkpoint_path(tmp_path, folders.get) == folders[4] / "checkpoints" / "last.ckpt"
    )
    (tmp_path / replicas.BATCH_FILE).write_text("{not json", encoding="utf-8")
    assert replicas.read_batch_file(tmp_path) is None
    assert replicas.checkpoint_path(tmp_path, folders.get) == tmp_path / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    "data",
    [
        {"runs": [1, 2], "index": 5},
        {"runs": [1, 1], "index": 0},
        {"runs": [1, 2], "index": "0"},
        {"runs": [1, 2], "index": 0, "leader": 9},
        {"runs": [True, 2], "index": 0},
        {"runs": [], "index": 0},
    ],
)
def test_a_batch_file_that_does_not_hold_together_is_not_read(tmp_path, data):
    import json

    (tmp_path / replicas.BATCH_FILE).write_text(json.dumps(data), encoding="utf-8")
    assert replicas.read_batch_file(tmp_path) is None


def test_seed_ranges_are_bounded_before_they_are_expanded():
    with pytest.raises(ValueError, match="more than 256"):
        replicas.parse_seeds("0-1000000000")  # refused without building the list


def test_a_batch_folder_is_left_behind_only_when_no_member_holds_it(tmp_path):
    runs = tmp_path / "s.db.runs"
    folders = {i: runs / str(i) for i in (4, 5, 6)}
    for index, run_id in enumerate((4, 5, 6)):
        replicas.write_batch_file(folders[run_id], [4, 5, 6], index, batch=4)
    assert replicas.read_batch_file(folders[5]) == {"runs": [4, 5, 6], "index": 1, "batch": 4}
    folder = runs / replicas.BATCHES / "4"
    assert replicas.checkpoint_path(folders[6], folders.get) == folder / "checkpoints" / "last.ckpt"
    present = {5, 6}
    assert replicas.folder_left_behind(folders[4], folders.get, present.intersection) is None
    # Run 6 trained alone since (its batch file gone): run 5 is the last that holds it.
    (folders[6] / replicas.BATCH_FILE).unlink()
    assert replicas.folder_left_behind(folders[5], folders.get, {6}.intersection) == folder
    assert replicas.folder_left_behind(folders[6], folders.get, {5}.intersection) is None
