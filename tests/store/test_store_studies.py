"""The store's studies: created with their runs, claimed by workers, stopped, requeued."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from blockviz.store import RunStore, StoreError
from blockviz.store.schema import SCHEMA_VERSION
from blockviz.store.studies import MAX_LOST
from tests.helpers import other_connection


def _runs(n: int) -> list[dict]:
    return [
        {"variant": f"v{i // 2}", "seed": i % 2 + 1, "config": "{}", "max_steps": 10}
        for i in range(n)
    ]


def test_a_study_is_created_with_its_runs_in_order(store_url) -> None:
    with RunStore(store_url) as store:
        study_id, run_ids = store.create_study("lr sweep", "sweep", "quick", {"k": 1}, _runs(4))
        study = store.get_study(study_id)
        assert (study.name, study.key, study.status, study.spec) == (
            "lr sweep", "sweep", "running", {"k": 1},
        )  # fmt: skip
        runs = store.study_runs(study_id)
        assert runs["id"].tolist() == run_ids
        assert runs["variant"].tolist() == ["v0", "v0", "v1", "v1"]
        assert runs["seed"].tolist() == [1, 2, 1, 2]
        assert set(runs["status"]) == {"queued"}
        assert runs["name"].is_unique
        assert store.runs_frame()["study_id"].tolist() == [study_id] * 4
        frame = store.studies_frame()
        assert frame[["runs", "queued", "finished"]].values.tolist() == [[4, 4, 0]]


def test_workers_claim_each_run_once(store_url) -> None:
    with RunStore(store_url) as store:
        study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(3))
        claimed = [store.claim_study_run(study_id, 100 + i, None) for i in range(4)]
        assert claimed == [*run_ids, None]
        assert store.get_run(run_ids[1]).pid == 101


def test_workers_claim_replica_batches_of_one_key_in_order_each_run_once(store_url) -> None:
    # Keys by config: runs of shape "a" batch together (at most 2), "b" alone, None alone.
    runs = [
        {"variant": f"v{i}", "seed": 1, "config": f'{{"k": "{k}"}}', "max_steps": 10}
        for i, k in enumerate("aabab")
    ]

    def key_of(config: str | None) -> str | None:
        return None if '"b"' in (config or "") else config

    with RunStore(store_url) as store:
        study_id, ids = store.create_study("s", "sweep", "quick", {}, runs)
        claims = [store.claim_study_runs(study_id, 200 + i, None, 2, key_of) for i in range(5)]
        assert claims == [[ids[0], ids[1]], [ids[2]], [ids[3]], [ids[4]], []]
        assert [store.get_run(i).pid for i in ids] == [200, 200, 201, 202, 203]
        # A limit of 1 claims one run at a time, whatever the keys.
        study_id, ids = store.create_study("t", "sweep", "quick", {}, runs)
        assert store.claim_study_runs(study_id, 300, None, 1, key_of) == [ids[0]]
        assert store.claim_study_runs(study_id, 301, None, 1, key_of) == [ids[1]]
        # Ten runs of one key, at most 8 at once: two even batches (5 + 5, not 8 + 2).
        ten = [
            {"variant": "v", "seed": i, "config": '{"k": "a"}', "max_steps": 1} for i in range(10)
        ]
        study_id, ids = store.create_study("u", "sweep", "quick", {}, ten)
        sizes = [len(store.claim_study_runs(study_id, 400 + i, None, 8, key_of)) for i in range(3)]
        assert sizes == [5, 5, 0]
        # Three shapes of three runs and two workers: each claim takes at most its worker's
        # share of what is left, so the last runs split between the workers (3, 3, 2, 1).
        nine = [
            {
                "variant": f"v{i // 3}",
                "seed": i % 3,
                "config": f'{{"k": "{i // 3}"}}',
                "max_steps": 1,
            }
            for i in range(9)
        ]
        study_id, ids = store.create_study("w", "sweep", "quick", {}, nine)

        def any_key(config: str | None) -> str | None:
            return config

        claims = [store.claim_study_runs(study_id, 500 + i, None, 8, any_key, 2) for i in range(5)]
        assert [len(c) for c in claims] == [3, 3, 2, 1, 0]
        assert claims[2] + claims[3] == ids[6:]


def test_unclaimed_study_runs_are_not_reaped_but_claimed_dead_ones_are(store_url) -> None:
    with RunStore(store_url) as store:
        study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(2))
        store.claim_study_run(study_id, 2**22 + 12345, time.time())  # no such process
        with other_connection(store) as execute:
            execute("UPDATE runs SET created = 0, heartbeat = NULL")  # claimed long ago
        assert store.reap_dead() == [run_ids[0]]
        assert store.get_run(run_ids[1]).status == "queued"


def test_requeued_runs_keep_their_rows_until_a_claim_starts_them_over(store_url) -> None:
    # Requeueing used to delete a stopped run's rows at once: it trained from step 0 even
    # with a checkpoint to continue from. Now the claim decides: no checkpoint, start over.
    with RunStore(store_url) as store:
        study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(3))
        first = store.claim_study_run(study_id, os.getpid(), None)
        store.update_run(first, status="completed", final={"val_loss": 1.0})
        store.update_run(run_ids[1], started=time.time(), step=5, final={"time_s": 3.0})
        store.log_metrics(run_ids[1], 5, {"train/loss": 2.0})
        store.flush()
        assert store.stop_unclaimed(study_id) == 2
        assert store.study_active_runs(study_id) == []
        assert store.requeue_runs(run_ids) == 2  # the completed run stays as it is
        assert store.get_run(first).status == "completed"
        again = store.get_run(run_ids[1])
        assert (again.status, again.pid, again.step, again.final) == (
            "queued", None, 5, {"time_s": 3.0}
        )  # fmt: skip
        assert len(store.scalars(run_ids[1])) == 1
        assert store.study_active_runs(study_id) == run_ids[1:]

        assert store.claim_study_runs(study_id, os.getpid(), None, 8, lambda c: "k") == run_ids[1:]
        fresh = store.get_run(run_ids[1])
        assert (fresh.started, fresh.step, fresh.final) == (None, 0, None)
        assert store.scalars(run_ids[1]).empty


def _checkpointed_batch(store: RunStore, run_ids: list[int]) -> None:
    """What a batch of replicas that trained and checkpointed leaves: each member's
    replicas.json and the batch's last.ckpt (its bytes are never read by a claim)."""
    from blockviz.core import replicas

    for index, run_id in enumerate(run_ids):
        replicas.write_batch_file(store.run_dir(run_id), run_ids, index, batch=run_ids[0])
        store.update_run(run_id, started=time.time(), step=20)
        store.log_metrics(run_id, 19, {"train/loss": 2.0})
    store.flush()
    checkpoint = replicas.checkpoint_path(store.run_dir(run_ids[0]), store.run_dir)
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"a checkpoint")


def test_a_requeued_batch_with_a_checkpoint_is_claimed_whole_once_none_is_held(store_url):
    with RunStore(store_url) as store:
        study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(4))
        batch = run_ids[1:3]
        _checkpointed_batch(store, batch)
        for run_id in batch:
            store.update_run(run_id, status="stopped")
        store.update_run(batch[1], status="running", pid=os.getpid())  # still held
        assert store.requeue_runs(batch) == 1
        # Only fresh runs to claim while a member of the batch is held; one at a time.
        one = lambda config: None  # noqa: E731  (no two runs share a batch key)
        assert store.claim_study_runs(study_id, 11, None, 1, one) == [run_ids[0]]
        assert store.claim_study_runs(study_id, 12, None, 1, one) == [run_ids[3]]
        assert store.claim_study_runs(study_id, 13, None, 1, one) == []
        store.update_run(batch[1], status="stopped")
        assert store.requeue_runs(batch) == 1
        # The batch's checkpoint holds both: claimed together, past the limit of 1.
        assert store.claim_study_runs(study_id, 14, None, 1, one) == batch
        for run_id in batch:
            run = store.get_run(run_id)
            assert (run.status, run.pid, run.step) == ("queued", 14, 20)
            assert store.scalars(run_id)["step"].tolist() == [19]


def test_a_lost_run_of_a_running_study_is_queued_again_a_bounded_number_of_times(store_url):
    with RunStore(store_url) as store:
        study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(2))
        run_id = run_ids[0]

        def lose() -> None:  # claimed by a process that is gone, silent long ago
            assert store.claim_study_run(study_id, 2**22 + 12345, time.time()) == run_id
            store.update_run(run_id, status="running", started=1.0, heartbeat=1.0)
            assert store.reap_dead() == [run_id]

        for times in range(1, MAX_LOST + 1):
            lose()
            run = store.get_run(run_id)
            assert (run.status, run.pid, run.lost) == ("queued", None, times)
            assert f"queued again ({times} of at most {MAX_LOST} times)" in run.error
        lose()
        run = store.get_run(run_id)
        assert (run.status, run.lost) == ("failed", MAX_LOST + 1)
        assert f"lost {MAX_LOST + 1} times" in run.error
        assert f"study resume {study_id}" in run.error
        assert store.requeue_runs([run_id]) == 1  # a resume you type counts anew
        assert store.get_run(run_id).lost is None

        store.update_study(study_id, status="stopped")  # a stopped study's lost run stays so
        lose()
        assert store.get_run(run_id).status == "failed"


def test_study_fields_and_ids_are_checked(store_url) -> None:
    with RunStore(store_url) as store:
        study_id, _ = store.create_study("s", "sweep", "quick", {}, [])
        store.update_study(study_id, status="stopped", workers=[[1, 2.0]])
        assert store.get_study(study_id).workers == ((1, 2.0),)
        with pytest.raises(StoreError, match="status"):
            store.update_study(study_id, status="exploded")
        with pytest.raises(StoreError, match="cannot be set"):
            store.update_study(study_id, spec="{}")
        with pytest.raises(StoreError, match="no study 99"):
            store.get_study(99)
        with pytest.raises(StoreError, match="by its number"):
            store.get_study("../x")
        for digits in ("9" * 20, "9" * 5000):  # past SQLite's integers, past int()'s limit
            with pytest.raises(StoreError, match="no study 999"):
                store.get_study(digits)


def test_a_version_3_store_gains_studies(tmp_path) -> None:
    path = tmp_path / "s.db"
    with RunStore(path) as store:
        old = store.create_run("old", "{}", status="completed")
    with sqlite3.connect(path) as conn:
        for column in ("study_id", "variant", "seed"):
            conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        conn.execute("DROP TABLE studies")
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    with RunStore(path, readonly=True) as reader:
        assert reader.runs_frame()["study_id"].isna().all()
    with RunStore(path) as store:
        study_id, _ = store.create_study("s", "sweep", "quick", {}, _runs(1))
        assert store.get_run(old).name == "old"
        assert len(store.study_runs(study_id)) == 1
    with sqlite3.connect(path) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert int(version) == SCHEMA_VERSION == 7


def test_unclaimed_study_runs_wait_for_their_study_not_for_a_slot(tmp_path) -> None:
    from blockviz.launch import runner

    with RunStore(tmp_path / "s.db") as store:
        own = store.create_run("mine", "{}", status="queued")
        study_id, run_ids = store.create_study("s", "sweep", "quick", {}, _runs(3))
        store.claim_study_run(study_id, os.getpid(), None)
        frame = store.runs_frame()
        shown = runner.shown_in(frame, max_running=2)
        assert shown[own] == "starting"  # a slot is free for it
        assert shown[run_ids[0]] == "starting"  # claimed: a worker holds it
        assert shown[run_ids[1]] == shown[run_ids[2]] == "queued"
        listed = [run.id for run in runner.active(store, max_running=2)]
        assert listed == [own, run_ids[0]]


def test_the_runs_table_names_a_runs_study(tmp_path) -> None:
    from blockviz.dashboard import tables

    with RunStore(tmp_path / "s.db") as store:
        store.create_run("mine", "{}", status="completed")
        study_id, _ = store.create_study("s", "sweep", "quick", {}, _runs(1))
        table = tables.runs_table(store.runs_frame(), now=0.0)
        assert table["study"].tolist() == ["", f"#{study_id}"]


def test_a_study_is_completed_only_when_every_run_finished(store_url) -> None:
    """The last worker out marked a study completed with runs failed or stopped
    (`completed 0/2` after a time limit, `completed 3/4` after a host loss)."""
    with RunStore(store_url) as store:
        study_id, ids = store.create_study("s", "sweep", "quick", {}, _runs(4))
        store.update_study(study_id, status="running")
        for run_id, status in zip(ids, ["completed", "diverged", "failed", "queued"], strict=True):
            store.update_run(run_id, status=status)
        assert store.settle_study(study_id) is None  # a run is left to train: still running
        store.update_run(ids[3], status="stopped")
        assert store.settle_study(study_id) == "stopped"
        study = store.get_study(study_id)
        assert study.status == "stopped" and study.ended is not None
        assert study.error.startswith("2 of 4 runs failed or stopped; ")
        assert f"study resume {study_id}` trains them again" in study.error
        for run_id in ids[2:]:
            store.update_run(run_id, status="completed")
        store.update_study(study_id, status="running", error=None)
        assert store.settle_study(study_id) == "completed"
        assert store.get_study(study_id).error is None
        assert store.settle_study(study_id) is None  # not running any more
