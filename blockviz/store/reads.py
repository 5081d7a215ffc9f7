"""Metric reads: tidy DataFrames with fixed columns and dtypes, even when empty.

SQL does the filtering on the primary keys; the bucketing (downsample.py) runs in numpy
over (step, value) pairs, because moving rows into Python costs less than SQLite's
window-function sort (see benchmarks/bench_store.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from blockviz.core import spec
from blockviz.store.connection import Connection, Part, guarded
from blockviz.store.downsample import downsample_mask, series_starts
from blockviz.store.naming import RunRef
from blockviz.store.schema import (
    ATTENTION_FRAME,
    FINAL_METRICS_FRAME,
    HISTOGRAMS_FRAME,
    LAYER_STATS_DTYPES,
    LAYER_STATS_FRAME,
    SAMPLES_FRAME,
    SCALARS_FRAME,
    typed_frame,
)
from blockviz.store.values import decode_json, placeholders

# pandas (about a second to import) is imported where a frame is built: a training process
# writes through the store but never reads a frame.
if TYPE_CHECKING:
    import pandas as pd

    from blockviz.store.runs import RunLookup


def _transpose(rows: Sequence[tuple[Any, ...]], columns: Mapping[str, Any]) -> dict[str, Any]:
    """Query rows as one numpy array per column, in the given dtypes (NULL -> NaN).

    Column by column is several times faster than DataFrame.from_records on large reads.
    """
    if not rows:
        return {name: np.empty(0, dtype=dtype) for name, dtype in columns.items()}
    return {
        name: np.array(list(map(itemgetter(index), rows)), dtype=dtype)
        for index, (name, dtype) in enumerate(columns.items())
    }


class Reads(Part):
    """The part of RunStore that reads metric series, histograms, samples and maps."""

    def __init__(self, db: Connection, lookup: RunLookup) -> None:
        super().__init__(db)
        self.lookup = lookup

    @guarded
    def scalars(
        self,
        run_ids: RunRef | Iterable[RunRef] | None,
        names: str | Iterable[str] | None = None,
        after_step: int | None = None,
        max_points: int | None = None,
    ) -> pd.DataFrame:
        """Scalar series, ordered by run, name and step; downsampled when max_points is set."""
        ids = self.lookup.ids(run_ids)
        wanted = (
            None if names is None else sorted({names} if isinstance(names, str) else set(names))
        )
        sql = "SELECT step, value FROM scalars WHERE run_id = ? AND name = ?"
        if after_step is not None:
            sql += f" AND step > {int(after_step)}"
        sql += " ORDER BY step"
        # One primary-key range per series, fetching only (step, value): the per-row cost
        # of moving values into Python is what a read pays for, so move as few as we can.
        keys: list[tuple[int, str]] = []
        chunks: list[np.ndarray] = []
        for run_id in sorted(ids):
            for name in wanted if wanted is not None else sorted(self._names_of_run(run_id)):
                rows = self.conn.execute(sql, (run_id, name)).fetchall()
                if not rows:
                    continue
                data = np.array(rows, dtype=float)  # (n, 2): step, value; NULL -> NaN
                if max_points is not None:
                    steps = data[:, 0].astype(np.int64)  # (n,)
                    keep = downsample_mask(np.zeros(1, np.int64), steps, data[:, 1], max_points)
                    data = data[keep]
                keys.append((run_id, name))
                chunks.append(data)
        if not chunks:
            return typed_frame([], SCALARS_FRAME)
        lengths = [len(chunk) for chunk in chunks]
        data = np.concatenate(chunks)
        run_of = {run_id: run for run_id, run in self.lookup.names(ids).items()}
        import pandas as pd

        frame = pd.DataFrame(
            {
                "run_id": np.repeat([run_id for run_id, _ in keys], lengths),
                "run": np.repeat(np.array([run_of.get(r) for r, _ in keys], dtype=object), lengths),
                "step": data[:, 0].astype(np.int64),
                "name": np.repeat(np.array([name for _, name in keys], dtype=object), lengths),
                "value": data[:, 1],
            }
        )
        return frame.astype(SCALARS_FRAME)

    @guarded
    def scalar_names(self, run_ids: RunRef | Iterable[RunRef] | None) -> list[str]:
        """The distinct scalar names the runs have logged, sorted."""
        found: set[str] = set()
        for run_id in self.lookup.ids(run_ids):
            found.update(self._names_of_run(run_id))
        return sorted(found)

    def _names_of_run(self, run_id: int) -> list[str]:
        # Skip-scan over the primary key: one index seek per distinct name instead of
        # reading every row of the run.
        rows = self.conn.execute(
            "WITH RECURSIVE names(name) AS ("
            " SELECT MIN(name) FROM scalars WHERE run_id = ?"
            " UNION ALL"
            " SELECT (SELECT MIN(name) FROM scalars WHERE run_id = ? AND name > names.name)"
            " FROM names WHERE names.name IS NOT NULL"
            ") SELECT name FROM names WHERE name IS NOT NULL",
            (run_id, run_id),
        ).fetchall()
        return [row[0] for row in rows]

    @guarded
    def max_step(self, run_id: RunRef) -> int | None:
        """The largest step with any scalar recorded for the run, or None."""
        return self.max_logged_step(self.lookup.ids(run_id)[0])

    def max_logged_step(self, run_id: int) -> int | None:
        """`max_step` of a run id, for a part that holds the lock already."""
        steps = [
            self.conn.execute(
                "SELECT MAX(step) FROM scalars WHERE run_id = ? AND name = ?", (run_id, name)
            ).fetchone()[0]
            for name in self._names_of_run(run_id)
        ]
        return max(steps) if steps else None

    @guarded
    def layer_stats(
        self,
        run_ids: RunRef | Iterable[RunRef] | None,
        kind: str | Iterable[str] | None = None,
        stat: str | Iterable[str] | None = None,
        step: int | None = None,
        after_step: int | None = None,
        max_points: int | None = None,
        *,
        component: str | Iterable[str] | None = None,
        layer: int | Iterable[int] | None = None,
    ) -> pd.DataFrame:
        """Per-layer statistics, filtered; downsampled per series when max_points is set."""
        ids = self.lookup.ids(run_ids)
        filters: dict[str, list[Any]] = {"run_id": ids}
        for column, wanted in (
            ("kind", kind),
            ("stat", stat),
            ("component", component),
            ("layer", layer),
        ):
            if wanted is not None:
                filters[column] = [wanted] if isinstance(wanted, str | int) else list(wanted)
        if not all(filters.values()):
            return typed_frame([], LAYER_STATS_FRAME)
        where = [f"{column} IN ({placeholders(v)})" for column, v in filters.items()]
        params = [value for values in filters.values() for value in values]
        if step is not None:
            where.append(f"step = {int(step)}")
        if after_step is not None:
            where.append(f"step > {int(after_step)}")
        # Columns pinned to one value by a filter are not fetched: moving cells into
        # Python is most of a large read's cost.
        fixed = {column: values[0] for column, values in filters.items() if len(values) == 1}
        dtypes = {c: LAYER_STATS_DTYPES[c] for c in LAYER_STATS_DTYPES if c not in fixed}
        series = [c for c in ("run_id", "kind", "stat", "component", "layer") if c not in fixed]
        sql = (
            f"SELECT {', '.join(dtypes)} FROM layer_stats WHERE {' AND '.join(where)} "
            f"ORDER BY {', '.join([*series, 'step'])}"
        )
        arrays = _transpose(self.conn.execute(sql, params).fetchall(), dtypes)
        size = len(arrays["step"])
        if max_points is not None and size > 2 * max(1, max_points) + 1:
            starts = series_starts([arrays[c] for c in series]) if series else np.zeros(1, int)
            keep = downsample_mask(starts, arrays["step"], arrays["value"], max_points)
            arrays = {column: values[keep] for column, values in arrays.items()}
            size = len(arrays["step"])
        for column, value in fixed.items():
            arrays[column] = np.full(size, value, dtype=LAYER_STATS_DTYPES[column])
        import pandas as pd

        return self._with_run_names(pd.DataFrame(arrays), LAYER_STATS_FRAME)

    @guarded
    def layer_steps(
        self, run_id: RunRef, kind: str | None = None, stat: str | None = None
    ) -> list[int]:
        """The steps at which the run recorded layer statistics (of `kind`, `stat`), ascending."""
        where, params = ["run_id = ?"], [self.lookup.ids(run_id)[0]]
        for column, wanted in (("kind", kind), ("stat", stat)):
            if wanted is not None:
                where.append(f"{column} = ?")
                params.append(wanted)
        sql = f"SELECT DISTINCT step FROM layer_stats WHERE {' AND '.join(where)}"
        return sorted(row[0] for row in self.conn.execute(sql, params))

    def _with_run_names(self, frame: pd.DataFrame, schema: Mapping[str, str]) -> pd.DataFrame:
        """The frame plus a `run` (name) column, in the schema's column order and dtypes."""
        names = self.lookup.names(sorted({int(i) for i in frame["run_id"].unique()}))
        frame["run"] = frame["run_id"].map(names)
        return frame[list(schema)].astype(dict(schema))

    @guarded
    def histograms(
        self,
        run_id: RunRef,
        layer: int | None = None,
        tap: str | None = None,
        *,
        after_step: int | None = None,
    ) -> pd.DataFrame:
        """One row per histogram bin, with that bin's edges, ordered by layer, tap, step."""
        run_id = self.lookup.ids(run_id)[0]
        where, params = ["run_id = ?"], [run_id]
        if layer is not None:
            where.append("layer = ?")
            params.append(int(layer))
        if tap is not None:
            where.append("tap = ?")
            params.append(tap)
        if after_step is not None:
            where.append("step > ?")
            params.append(int(after_step))
        stored = self.conn.execute(
            "SELECT run_id, step, layer, tap, lo, hi, counts FROM histograms "
            f"WHERE {' AND '.join(where)} ORDER BY layer, tap, step",
            params,
        ).fetchall()
        rows: list[tuple[Any, ...]] = []
        for rid, step, lay, tap_name, lo, hi, counts_json in stored:
            counts = decode_json(counts_json) or []
            width = (hi - lo) / len(counts) if counts else 0.0
            rows.extend(
                (rid, step, lay, tap_name, i, lo + i * width, lo + (i + 1) * width, count)
                for i, count in enumerate(counts)
            )
        return typed_frame(rows, HISTOGRAMS_FRAME)

    @guarded
    def samples(self, run_id: RunRef, limit: int | None = None) -> pd.DataFrame:
        """Generated text samples of a run, newest first."""
        run_id = self.lookup.ids(run_id)[0]
        sql = "SELECT run_id, step, prompt, text FROM samples WHERE run_id = ? "
        sql += "ORDER BY step DESC"  # one sample per step (samples_series)
        params: list[Any] = [run_id]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return typed_frame(self.conn.execute(sql, params).fetchall(), SAMPLES_FRAME)

    @guarded
    def attention_steps(self, run_id: RunRef) -> list[int]:
        """The steps at which the run recorded attention maps, ascending."""
        run_id = self.lookup.ids(run_id)[0]
        rows = self.conn.execute(
            "SELECT DISTINCT step FROM attention WHERE run_id = ? ORDER BY step", (run_id,)
        ).fetchall()
        return [row[0] for row in rows]

    @guarded
    def attention(
        self,
        run_id: RunRef,
        step: int | None = None,
        *,
        layer: int | None = None,
        head: int | None = None,
    ) -> pd.DataFrame:
        """Attention maps at `step` (default: the latest), one row per (query, key)."""
        run_id = self.lookup.ids(run_id)[0]
        if step is None:
            step = self.conn.execute(
                "SELECT MAX(step) FROM attention WHERE run_id = ?", (run_id,)
            ).fetchone()[0]
            if step is None:
                return typed_frame([], ATTENTION_FRAME)
        where, params = ["run_id = ?", "step = ?"], [run_id, int(step)]
        if layer is not None:
            where.append("layer = ?")
            params.append(int(layer))
        if head is not None:
            where.append("head = ?")
            params.append(int(head))
        stored = self.conn.execute(
            "SELECT layer, head, tokens, weights FROM attention "
            f"WHERE {' AND '.join(where)} ORDER BY layer, head",
            params,
        ).fetchall()
        import pandas as pd

        parts: list[pd.DataFrame] = []
        for lay, hd, tokens_json, weights_json in stored:
            tokens = np.asarray(decode_json(tokens_json) or [], dtype=object)
            weights = np.asarray(decode_json(weights_json) or [], dtype=float)  # (T, T)
            size = len(tokens)
            if weights.shape != (size, size) or size == 0:
                continue  # a malformed map is skipped rather than breaking the page
            query = np.repeat(np.arange(size), size)  # (T*T,)
            key = np.tile(np.arange(size), size)  # (T*T,)
            parts.append(
                pd.DataFrame(
                    {
                        "run_id": run_id,
                        "step": int(step),
                        "layer": lay,
                        "head": hd,
                        "query": query,
                        "key": key,
                        "query_char": tokens[query],
                        "key_char": tokens[key],
                        "weight": weights.reshape(-1),
                    }
                )
            )
        if not parts:
            return typed_frame([], ATTENTION_FRAME)
        return pd.concat(parts, ignore_index=True).astype(ATTENTION_FRAME)

    @guarded
    def final_metrics(self, run_ids: RunRef | Iterable[RunRef] | None) -> pd.DataFrame:
        """One summary row per run: its final JSON where present, else its latest scalars."""
        ids = self.lookup.ids(run_ids)
        rows = []
        now = time.time()
        latest_of = {
            "train_loss": spec.TRAIN_LOSS,
            "val_loss": spec.VAL_LOSS,
            "val_ppl": spec.VAL_PPL,
            "val_bpc": spec.VAL_BPC,
            "answer_acc": spec.VAL_ANSWER_ACC,
            "answer_baseline": spec.VAL_ANSWER_BASELINE,
        }
        for run_id in ids:
            run = self.conn.execute(
                "SELECT name, status, step, diverged_step, started, ended, heartbeat, n_params, "
                "final FROM runs WHERE id = ?",
                (run_id,),
            ).fetchone()
            if run is None:
                continue  # deleted meanwhile: a missing row, not an error
            name, status, step, diverged, started, ended, beat, n_params, final_json = run
            final = decode_json(final_json)
            final = final if isinstance(final, dict) else {}
            values: dict[str, Any] = {
                key: self._latest_value(run_id, scalar) for key, scalar in latest_of.items()
            }
            (tokens_per_sec,) = self.conn.execute(
                "SELECT AVG(value) FROM scalars WHERE run_id = ? AND name = ?",
                (run_id, spec.TRAIN_TOKENS_PER_SEC),
            ).fetchone()
            finished_at = ended if ended is not None else (beat if beat is not None else now)
            values.update(
                steps=step if step is not None else self.max_step(run_id),
                diverged_at=diverged,
                time_s=None if started is None else finished_at - started,
                tokens_per_sec=tokens_per_sec,
                n_params=n_params,
            )
            for key in values:
                if final.get(key) is not None:
                    values[key] = final[key]
            rows.append((name, status, *(values[k] for k in list(FINAL_METRICS_FRAME)[2:])))
        return typed_frame(rows, FINAL_METRICS_FRAME)

    def _latest_value(self, run_id: int, name: str) -> float | None:
        row = self.conn.execute(
            "SELECT value FROM scalars WHERE run_id = ? AND name = ? ORDER BY step DESC LIMIT 1",
            (run_id, name),
        ).fetchone()
        return None if row is None else row[0]
