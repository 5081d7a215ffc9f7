"""The ledger's JSON form read back exactly, hostile files refused in one line, merging
that keeps every origin and adds nothing twice, and finding a claim by id or words."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from blockviz.core import ledger as ldg

HERE = ldg.Origin("box-a", "/data/a.db")
THERE = ldg.Origin("box-b", "/data/b.db")


def _set(study: int, seeds=(1, 2), verdict: str = "supported") -> ldg.SeedSetResult:
    return ldg.SeedSetResult(
        study=study,
        seeds=tuple(seeds),
        verdict=verdict,
        reason="Final val loss of a minus b: -0.1 (95% interval -0.2 to -0.05), below zero.",
        intervals=("a minus b: paired -0.1 (-0.2 to -0.05), n=2 pairs",),
        runs=6,
        unfinished=0,
        hosts=("box-a",),
        devices=("cpu, 1 thread",),
        unrecorded=0,
        date="2026-11-28",
    )


def _measurement(origin: ldg.Origin = HERE, studies=(1,), state: str = "no second set"):
    return ldg.Measurement(
        origin=origin,
        size="quick",
        variants=3,
        swept=("attention", "ffn"),
        replication=state,
        replication_reason="no disjoint seed set of this study's definition is stored yet",
        sets=tuple(_set(s) for s in studies),
        rerun=".venv/bin/python -m blockviz study run sublayers --size quick --seeds 3-4",
        field="lr",
        points=(ldg.Point(1, 1, 1e-3, "norm_position pre", 2.1, "converged"),
                ldg.Point(1, 2, 3e-1, "norm_position post", None, "diverged")),
    )  # fmt: skip


def _entry(measurements=(), claim: str = "Attention alone trains to a higher loss.") -> ldg.Entry:
    return ldg.Entry(
        id="sublayers-1",
        claim=claim,
        source="the course material",
        rule="lower_loss",
        study_key="sublayers",
        study_title="Attention, FFN, or both",
        run_command=".venv/bin/python -m blockviz study run sublayers --size quick",
        measurements=tuple(measurements),
    )


def _bytes(document) -> bytes:
    return json.dumps(document).encode()


def _export(entries=None) -> dict:
    entries = [_entry([_measurement()])] if entries is None else entries
    return ldg.to_json(ldg.Ledger("2026-11-28T02:00:00Z", HERE, tuple(entries)))


def test_an_export_reads_back_as_it_was_written() -> None:
    ledger = ldg.Ledger("2026-11-28T02:00:00Z", HERE, (_entry([_measurement()]), _entry()))
    ledger = replace(ledger, entries=(ledger.entries[0], replace(_entry(), claim="Another.")))
    assert ldg.parse(_bytes(ldg.to_json(ledger))) == ledger


def _hostile(document: dict, path: list, value) -> bytes:
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return _bytes(document)


ENTRY = ["entries", 0]
SET = [*ENTRY, "measurements", 0, "sets", 0]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"\xff\xfe not text", "is not UTF-8 text"),
        (b"{not json", "is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
        (b'{"format": NaN}', "is not JSON"),
        (_bytes({"format": "something else"}), "format: expected 'blockviz-ledger'"),
        (_bytes({**_export(), "version": 99}), "version: 99; this blockviz reads version 1"),
        (_bytes([1, 2]), "the top level: expected an object"),
        (_hostile(_export(), ENTRY, "a claim"), "entries[0]: expected an object"),
        (_hostile(_export(), [*ENTRY, "claim"], 42), "entries[0].claim: expected text"),
        (_hostile(_export(), [*ENTRY, "claim"], "x" * 5000), "5,000 characters, more than"),
        (_hostile(_export(), [*SET, "seeds"], [1, -2]), "sets[0].seeds[1]: expected a whole"),
        (_hostile(_export(), [*SET, "seeds"], list(range(6000))), "6,000 items, more than"),
        (_hostile(_export(), [*SET, "verdict"], "proven"), '"proven" is not one of supported'),
        (_hostile(_export(), [*SET, "runs"], True), "runs: expected a whole number"),
        (
            _hostile(_export(), [*ENTRY, "measurements", 0, "points", 0, "x"], "1e-3"),
            "points[0].x: expected a finite number",
        ),
        (
            _hostile(_export(), [*ENTRY, "measurements", 0, "replication", "state"], "settled"),
            'replication.state: "settled" is not one of replicated',
        ),
        (_bytes({k: v for k, v in _export().items() if k != "origin"}), "origin: missing"),
        (_bytes(_export([_entry(), _entry()])), "entries: a claim appears twice"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_or_hostile_file_is_one_line_naming_what_is_wrong(data: bytes, said: str) -> None:
    with pytest.raises(ldg.LedgerError) as caught:
        ldg.parse(data, "peer.json")
    message = str(caught.value)
    assert said in message, message
    assert message.startswith("peer.json ") and "\n" not in message


def test_a_file_past_the_size_limit_is_refused_before_it_is_read_as_json() -> None:
    data = b" " * (ldg.MAX_FILE_BYTES + 1)
    with pytest.raises(ldg.LedgerError, match="larger than a ledger export's limit of 8 MiB"):
        ldg.parse(data, "big.json")


def test_merge_keeps_each_origin_and_adds_the_same_measurement_once() -> None:
    here = [_entry([_measurement(HERE)])]
    there = [_entry([_measurement(THERE)])]
    merged = ldg.merge(here, [there, there])
    assert [m.origin for m in merged[0].measurements] == [HERE, THERE]
    newer = [_entry([_measurement(THERE, state="pending")])]
    updated = ldg.merge(merged, [newer])
    assert [m.replication for m in updated[0].measurements] == ["no second set", "pending"]


def test_merge_appends_a_claim_no_base_has_with_an_id_of_its_own() -> None:
    older = [_entry([_measurement(THERE)], claim="An older wording of the claim.")]
    merged = ldg.merge([_entry()], [older])
    assert [e.id for e in merged] == ["sublayers-1", "sublayers-1.2"]
    assert merged[1].measurements[0].origin == THERE


def test_an_entry_without_measurements_is_not_run() -> None:
    assert _entry().state == ldg.NOT_RUN
    assert _entry([_measurement(state="replicated")]).state == "replicated"


def test_find_takes_an_id_or_words_and_names_the_choices_otherwise() -> None:
    entries = [_entry(), replace(_entry(), id="sublayers-2", claim="The FFN alone trains higher.")]
    assert ldg.find(entries, "sublayers-2").id == "sublayers-2"
    assert ldg.find(entries, "ffn ALONE").id == "sublayers-2"
    with pytest.raises(ldg.LedgerError, match=r"matches 2 claims \(sublayers-1, sublayers-2\)"):
        ldg.find(entries, "trains")
    with pytest.raises(ldg.LedgerError, match="no claim 'nothing'; `ledger list`"):
        ldg.find(entries, "nothing")


def test_a_set_says_what_the_store_did_not_record() -> None:
    bare = replace(_set(1), hosts=(), devices=(), unrecorded=6)
    assert bare.machine() == "host not recorded: device not recorded"
    some = replace(_set(1), unrecorded=2)
    assert some.machine() == "host box-a: cpu, 1 thread (2 of 6 runs recorded no host)"
