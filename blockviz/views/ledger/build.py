"""The claim ledger of one store: every built-in claim with each stored definition of its
study judged (`core.ledger`'s entries), and the exports imported beside the store merged in.

A stored study counts when it has claims (a built-in's, or an older version's: its claims
keep entries of their own). Its definition is its spec without the seeds
(`studies.replication.definition`); each definition's studies are its seed sets, each
judged on its own runs (`studies.verdicts`), and replicated across one another
(`studies.replication.replicate`, the oldest set against the rest). Machine and date come
from what the store recorded: each run's host and device text, the study's end (or
creation) date; what is missing is said, never filled in.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from blockviz.core import ledger as ldg
from blockviz.core import procs
from blockviz.core.fields import ConfigError
from blockviz.core.studies import builtins
from blockviz.core.studies import replication as rep
from blockviz.core.studies.define import Claim, StudyDef, plan_from_spec
from blockviz.core.studies.outcomes import results_frame
from blockviz.core.studies.rules.base import group_name, select
from blockviz.core.studies.verdicts import NEEDS, needed_runs, verdicts
from blockviz.store import RunStore, StudyRecord
from blockviz.views.commands import command_line
from blockviz.views.ledger import imports
from blockviz.views.studies.table import interval_lines, sensitivity_display

LEDGER_SIZE = "quick"  # the size a claim not run yet is offered at


@dataclass(frozen=True)
class _Stored:
    """One stored study with claims: its record, plan, results and seed set."""

    record: StudyRecord
    plan: StudyDef
    results: pd.DataFrame
    seed_set: rep.SeedSet
    machine: tuple[tuple[str, ...], tuple[str, ...], int]  # hosts, devices, runs without host


def origin_of(store: RunStore) -> ldg.Origin:
    """This host and this store, as a measurement read here records them."""
    return ldg.Origin(procs.this_host(), store.where)


def _date(record: StudyRecord) -> str | None:
    stamp = record.ended or record.created
    return time.strftime("%Y-%m-%d", time.gmtime(stamp)) if stamp else None


def _machine(
    store: RunStore, run_ids: Iterable[int]
) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """The host names and device texts the runs recorded, and how many recorded no host."""
    hosts, devices, unrecorded = {}, {}, 0
    for run_id in run_ids:
        run = store.get_run(int(run_id))
        if run.host:
            hosts[run.host] = None
        else:
            unrecorded += 1
        if run.device:
            devices[run.device] = None
    return tuple(hosts), tuple(devices), unrecorded


def _stored(store: RunStore, problems: list[str]) -> list[_Stored]:
    """Every stored study that tests a claim, oldest first, judged alone; a study this
    version cannot read (a spec from another version) is left out with a line in
    `problems`."""
    out = []
    for study_id in store.studies_frame()["id"].astype(int):
        record = store.get_study(int(study_id))
        if not record.spec or not record.spec.get("claims"):
            continue
        try:
            plan = plan_from_spec(record.spec)
            results = results_frame(store.study_runs(int(study_id)), plan)
            judged = tuple(verdicts(plan, results))
        except (TypeError, ValueError, KeyError) as exc:
            problems.append(f"left out: study {study_id} cannot be judged by this version: {exc}")
            continue
        unfinished = int((results["outcome"] == "").sum())
        seed_set = rep.SeedSet(int(study_id), plan.seeds, judged, unfinished)
        out.append(_Stored(record, plan, results, seed_set, _machine(store, results["run_id"])))
    return out


def _points(claim: Claim, stored: _Stored) -> tuple[str | None, tuple[ldg.Point, ...]]:
    """A claim judged across a swept field: the field and each finished run it rests on."""
    field = claim.args.get("field")
    results = stored.results
    if not isinstance(field, str) or field not in results.columns:
        return None, ()
    runs = needed_runs(claim, results)
    groups = NEEDS[claim.rule](claim.args)
    group_of: dict[int, str] = {}
    for group in groups:
        for run_id in select(results, group)["run_id"]:
            group_of.setdefault(int(run_id), group_name(group))
    points = tuple(
        ldg.Point(
            study=stored.seed_set.study_id,
            seed=int(row.seed),
            x=float(getattr(row, field)),
            group=group_of.get(int(row.run_id), f"other {field} values"),
            val_loss=float(row.val_loss) if pd.notna(row.val_loss) else None,
            outcome=str(row.outcome),
        )
        for row in runs.itertuples(index=False)
        if row.outcome
    )
    return field, points


def _sensitivity(claim: Claim, stored: _Stored) -> tuple[str, ...]:
    """A claim judged across learning rates: each setting's LR sensitivity and best loss
    over the sweep, with their intervals, as the study page's table gives them."""
    if claim.args.get("field") != "lr":
        return ()
    table = sensitivity_display(stored.results, stored.plan.swept)
    if table is None:
        return ()
    by = table.columns[0]
    return tuple(
        f"{row[by]}: LR sensitivity {row['LR sensitivity'] or '—'} (95% interval "
        f"{row['95% interval'] or 'none'}), best loss {row['best loss'] or '—'} (95% interval "
        f"{row['best loss, 95% interval'] or 'none'}), {row['seeds']} seed(s)"
        for row in table.to_dict(orient="records")
    )


def _set_result(stored: _Stored, index: int) -> ldg.SeedSetResult:
    verdict = stored.seed_set.verdicts[index]
    hosts, devices, unrecorded = stored.machine
    return ldg.SeedSetResult(
        study=stored.seed_set.study_id,
        seeds=stored.seed_set.seeds,
        verdict=verdict.verdict,
        reason=verdict.reason,
        intervals=tuple(interval_lines(verdict)),
        runs=len(stored.results),
        unfinished=stored.seed_set.unfinished,
        hosts=hosts,
        devices=devices,
        unrecorded=unrecorded,
        date=_date(stored.record),
        sensitivity=_sensitivity(verdict.claim, stored),
    )


def _rerun(store: RunStore, group: list[_Stored], index: int) -> str | None:
    """The `study run` command that stores this definition again on fresh seeds: as many
    as the claim's interval needs (`replication.seeds_needed`), else as many as the
    first set had; None where no command re-runs it (a built-in changed since)."""
    first = group[0]
    needed = rep.seeds_needed(first.seed_set.verdicts[index])
    counts = [len(first.plan.seeds)]
    if needed is not None and needed.n is not None:
        counts.insert(0, needed.n)
    for count in counts:  # the seeds needed can make a study too big to run: then as many
        try:  # as the first set had
            words = rep.rerun_words(first.plan, rep.next_seeds([s.seed_set for s in group], count))
        except ConfigError:
            continue
        return command_line(store, *words) if words else None
    return None


def _measurements(
    store: RunStore, group: list[_Stored], origin: ldg.Origin
) -> list[tuple[Claim, ldg.Measurement]]:
    """Each claim of one definition's seed sets, measured."""
    first, others = group[0], [s.seed_set for s in group[1:]]
    out = []
    for index, replication in enumerate(rep.replicate(first.seed_set, others)):
        claim = replication.claim
        field, points = None, ()
        sets = []
        for stored in group:
            sets.append(_set_result(stored, index))
            found_field, found = _points(claim, stored)
            field, points = found_field or field, points + found
        measurement = ldg.Measurement(
            origin=origin,
            size=first.plan.size,
            variants=len(first.plan.variants),
            swept=first.plan.swept,
            replication=replication.state,
            replication_reason=replication.reason,
            sets=tuple(sets),
            rerun=_rerun(store, group, index),
            field=field,
            points=points,
        )
        out.append((claim, measurement))
    return out


def _builtin_entries(store: RunStore) -> list[ldg.Entry]:
    """Every claim of today's built-in studies, in their order, not yet measured."""
    out = []
    for key in builtins.STUDY_KEYS:
        study = builtins.BUILTINS[key]()
        command = command_line(store, "study", "run", key, "--size", LEDGER_SIZE)
        for index, claim in enumerate(study.claims):
            out.append(
                ldg.Entry(
                    ldg.claim_id(key, index),
                    claim.text,
                    claim.source,
                    claim.rule,
                    key,
                    study.title,
                    command,
                )
            )
    return out


def local_entries(store: RunStore, problems: list[str] | None = None) -> list[ldg.Entry]:
    """The ledger of this store alone: every built-in claim, each with the measurements of
    this store's studies (a claim of a stored study that no built-in has today gets an
    entry of its own)."""
    origin = origin_of(store)
    groups: dict[str, list[_Stored]] = {}
    for stored in _stored(store, [] if problems is None else problems):
        groups.setdefault(rep.definition(stored.record.spec), []).append(stored)
    measured: list[ldg.Entry] = []
    for group in groups.values():
        plan = group[0].plan
        for index, (claim, measurement) in enumerate(_measurements(store, group, origin)):
            measured.append(
                ldg.Entry(
                    ldg.claim_id(plan.key, index),
                    claim.text,
                    claim.source,
                    claim.rule,
                    plan.key,
                    plan.title,
                    command_line(store, "study", "run", plan.key, "--size", LEDGER_SIZE),
                    (measurement,),
                )
            )
    return ldg.merge(_builtin_entries(store), [measured])


@dataclass(frozen=True)
class Merged:
    """This store's ledger with the imported exports merged in, and a line for each
    stored study or imported file left out because it does not read."""

    entries: list[ldg.Entry]
    problems: list[str]


def merged(store: RunStore) -> Merged:
    """This store's ledger with every imported export merged in (`imports.imported`): an
    imported measurement of this very store (its own export imported back) gives way to
    what the store holds now."""
    problems: list[str] = []
    local = local_entries(store, problems)
    ledgers, unread = imports.imported(store)
    joined = ldg.merge(local, [led.entries for led in ledgers])
    return Merged(ldg.merge(joined, [local]), problems + unread)


def ledger(store: RunStore) -> ldg.Ledger:
    """The merged ledger as this store exports it, stamped now (UTC)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return ldg.Ledger(stamp, origin_of(store), tuple(merged(store).entries))
