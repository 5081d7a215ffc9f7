"""The ledger read from a store (constructed studies, no training): every built-in claim,
each stored definition measured with its seed sets, machine, date and re-run command,
imports kept beside the store, and the offline page with nothing to fetch and no markup
from user text."""

from __future__ import annotations

import json
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from blockviz.core import ledger as ldg
from blockviz.core.studies import builtins
from blockviz.store import RunStore
from blockviz.views.ledger import build, imports, page
from blockviz.views.studies import replication as study_replication
from tests.helpers import fake_study


@pytest.fixture
def store(tmp_path: Path):
    with RunStore(tmp_path / "ledger.db") as opened:
        yield opened


def _entry(entries: list[ldg.Entry], claim_id: str) -> ldg.Entry:
    return next(e for e in entries if e.id == claim_id)


def _record_machine(store: RunStore, study_id: int, host: str | None) -> None:
    for run_id in store.study_runs(study_id)["id"]:
        store.update_run(int(run_id), host=host, device="cpu, 1 thread")


def test_a_store_without_studies_lists_every_builtin_claim_as_not_run(store: RunStore) -> None:
    entries = build.merged(store).entries
    claims = [c.text for key in builtins.STUDY_KEYS for c in builtins.BUILTINS[key]().claims]
    assert [e.claim for e in entries] == claims
    assert all(e.state == ldg.NOT_RUN for e in entries)
    norm = _entry(entries, "norm-position-1")
    assert norm.run_command.endswith(f"study run norm-position --size quick --store {store.where}")


def test_each_seed_set_of_a_definition_is_judged_alone_with_its_machine_date_and_rerun(
    store: RunStore,
) -> None:
    first = fake_study(store, "activation")
    second = fake_study(store, "activation", seeds="3-4")
    _record_machine(store, first, "box-a")
    _record_machine(store, second, None)  # a store that recorded no host for these runs
    (entry,) = [e for e in build.merged(store).entries if e.study_key == "activation"]
    (measurement,) = entry.measurements
    # The same verdicts and replication the Studies page and `study show` give study 1.
    (shown,) = study_replication.claims(store, study_replication.seed_sets(store, first))
    assert measurement.replication == shown.replication.state
    assert measurement.replication_reason == shown.replication.reason
    assert [s.study for s in measurement.sets] == [first, second]
    assert [s.seeds for s in measurement.sets] == [(1, 2), (3, 4)]
    assert measurement.sets[0].verdict == shown.verdict.verdict
    assert measurement.sets[0].reason == shown.verdict.reason
    assert measurement.sets[0].intervals and "paired" in measurement.sets[0].intervals[0]
    assert measurement.sets[0].machine() == "host box-a: cpu, 1 thread"
    assert measurement.sets[1].machine() == "host not recorded: cpu, 1 thread"
    assert measurement.sets[0].date is not None and len(measurement.sets[0].date) == 10
    assert measurement.origin == build.origin_of(store)
    assert measurement.grid() == "4 variants (activation) × each set's seeds"
    # Fresh seeds after the highest either set used.
    assert measurement.rerun is not None and "--seeds 5-" in measurement.rerun


def test_another_size_of_a_study_is_a_definition_of_its_own(store: RunStore) -> None:
    fake_study(store, "sublayers")
    plan = builtins.builtin("sublayers", "standard", 2)
    store.create_study("std", "sublayers", "standard", plan.to_spec(), [])  # no run yet
    (entry,) = [e for e in build.merged(store).entries if e.id == "sublayers-1"]
    assert [m.size for m in entry.measurements] == ["quick", "standard"]
    assert entry.measurements[1].sets[0].verdict == "pending"


def test_a_swept_claim_carries_each_finished_run_of_its_sides(store: RunStore) -> None:
    fake_study(store, "lr-sensitivity")
    entry = _entry(build.merged(store).entries, "lr-sensitivity-1")
    (measurement,) = entry.measurements
    assert measurement.field == "lr"
    groups = {p.group for p in measurement.points}
    assert groups == {"norm_position pre", "norm_position post"}
    assert len(measurement.points) == 2 * 7 * 2  # sides × learning rates × seeds
    assert {p.x for p in measurement.points} == set(builtins.LR_GRID)
    # Each setting's sensitivity and best loss with their intervals, as the study shows.
    (first, *_) = measurement.sets
    assert [line.split(":")[0] for line in first.sensitivity] == ["pre", "post", "none"]
    assert "LR sensitivity " in first.sensitivity[0] and "best loss " in first.sensitivity[0]
    assert "(95% interval " in first.sensitivity[0] and first.sensitivity[0].endswith("2 seed(s)")
    fake_study(store, "sublayers")  # no learning rate swept: no such lines
    (other,) = _entry(build.merged(store).entries, "sublayers-1").measurements
    assert other.sets[0].sensitivity == ()


def _export_of(store: RunStore) -> bytes:
    return json.dumps(ldg.to_json(build.ledger(store))).encode()


def test_an_import_keeps_its_origin_and_the_same_file_twice_adds_nothing(
    tmp_path: Path, store: RunStore
) -> None:
    with RunStore(tmp_path / "elsewhere.db") as other:
        fake_study(other, "sublayers")
        data = _export_of(other)
    done = imports.accept(store, data, "peer.json")
    assert not done.already and done.path.parent == store.ledger_root
    again = imports.accept(store, data + b"\n", "peer.json")  # the same export, re-spaced
    assert again.already and again.path == done.path
    assert len(list(store.ledger_root.glob("*.json"))) == 1
    entry = _entry(build.merged(store).entries, "sublayers-1")
    (measurement,) = entry.measurements
    assert measurement.origin.store.endswith("elsewhere.db")


def test_a_store_importing_its_own_export_shows_what_it_holds_now(store: RunStore) -> None:
    study_id = fake_study(store, "sublayers")
    imports.accept(store, _export_of(store), "mine.json")
    fake_study(store, "sublayers", seeds="3-4")  # a second set after the export
    (measurement,) = _entry(build.merged(store).entries, "sublayers-1").measurements
    assert [s.study for s in measurement.sets] == [study_id, study_id + 1]


def test_an_imported_file_damaged_later_is_left_out_and_said(store: RunStore) -> None:
    store.ledger_root.mkdir(parents=True)
    (store.ledger_root / "0123456789abcdef.json").write_text("{broken", encoding="utf-8")
    merged = build.merged(store)
    assert len(merged.entries) == sum(len(b().claims) for b in builtins.BUILTINS.values())
    (problem,) = merged.problems
    assert problem.startswith("left out: ") and "is not JSON" in problem


def test_a_study_this_version_cannot_judge_is_left_out_and_said(store: RunStore) -> None:
    fake_study(store, "sublayers")
    plan = builtins.builtin("activation", "quick")
    spec = {**plan.to_spec(), "a_field_from_elsewhere": 1}  # another version's spec
    store.create_study("odd", "activation", "quick", spec, [])
    merged = build.merged(store)
    (problem,) = merged.problems
    assert problem.startswith("left out: study 2 cannot be judged by this version: ")
    assert _entry(merged.entries, "sublayers-1").measurements  # the others are still read
    assert not _entry(merged.entries, "activation-1").measurements


# ------------------------------------------------------------------------ the page


class _References(HTMLParser):
    """Every attribute of the page that could make a browser fetch something."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data", "action", "poster") and value:
                self.fetched.append((tag, name, value))


def _parsed(text: str) -> _References:
    parser = _References()
    parser.feed(text)
    return parser


@pytest.mark.slow  # vl-convert builds the Vega bundle (seconds)
def test_the_page_refers_to_nothing_on_the_network(store: RunStore) -> None:
    fake_study(store, "lr-sensitivity")
    text = page.ledger_html(build.ledger(store))
    found = _parsed(text)
    assert found.fetched == []
    assert "<link" not in text.lower() and "@import" not in text
    assert text.count("<script>") == 2  # the bundle, and the loop that draws the charts
    assert "vegaEmbed" in text and "id='chart-0'" in text and "id='chart-1'" in text


def _page_of(text: str, side: str) -> str:
    """A one-claim page with `text` in every field a user or another machine writes."""
    entry = ldg.Entry(
        "x-1", text, text, "less_sensitive", "x", text, f"run {text}",
        (
            ldg.Measurement(
                ldg.Origin(text, text), "quick", 1, (text,), "pending", text,
                (ldg.SeedSetResult(1, (1,), "pending", text, (text,), 2, 1, (text,), (text,), 0,
                                   text),),
                text, "lr", (ldg.Point(1, 1, 1e-3, side, 2.0, "converged"),),
            ),
        ),
    )  # fmt: skip
    return page.ledger_html(ldg.Ledger(text, ldg.Origin(text, text), (entry,)))


def test_user_text_on_the_page_is_text_never_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(page, "vega_bundle", lambda: "/* the bundle */")
    hostile = "<script>alert(1)</script><img src=http://evil.example/x>"
    text = _page_of(hostile, "</script><b>side</b>")
    found = _parsed(text)
    assert found.fetched == []
    assert found.tags == _parsed(_page_of("plain words", "side")).tags  # no element added
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "\\u003c/script\\u003e\\u003cb\\u003eside" in text  # inside the chart's JSON


def test_a_claim_not_run_shows_its_command_and_the_page_needs_no_script(store: RunStore) -> None:
    ledger = build.ledger(store)
    text = page.ledger_html(ledger)
    assert "<script" not in text  # no chart to draw: no bundle either
    assert text.count("class='card'") == len(ledger.entries)
    assert "study run norm-position --size quick" in text


def test_a_measurement_without_a_swept_field_has_no_chart(store: RunStore) -> None:
    fake_study(store, "sublayers")
    entry = _entry(build.merged(store).entries, "sublayers-1")
    assert page.chart_spec(entry.measurements[0]) is None
    swept = replace(entry.measurements[0], field="lr")  # a field but no points
    assert page.chart_spec(swept) is None


def test_a_rerun_too_big_for_the_seeds_needed_offers_the_first_sets_count(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qk-norm-z-loss has 28 variants: the 30 seeds a weak claim needs would be 840 runs,
    which `study run` refuses; the ledger broke on that refusal. It now offers a re-run on
    as many fresh seeds as the first set had."""
    fake_study(store, "qk-norm-z-loss")
    real = build.rep.seeds_needed

    def thirty(verdict):
        needed = real(verdict)
        return None if needed is None else replace(needed, n=30)

    monkeypatch.setattr(build.rep, "seeds_needed", thirty)
    entries = [e for e in build.merged(store).entries if e.study_key == "qk-norm-z-loss"]
    reruns = [m.rerun for e in entries for m in e.measurements]
    assert reruns and all(r is not None and "--seeds 3-4" in r for r in reruns), reruns
