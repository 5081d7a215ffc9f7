"""Per-step series of one run, read once and then extended with the rows logged since.

The Live page redraws every 1.5 s while a run trains; reading a long run whole each time
would cost more than drawing it. `IncrementalReader` keeps what it read in a mapping the
caller owns (Streamlit's session state on the page, a plain dict in a test), so it needs
neither Streamlit nor anything but the store's public reads.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from blockviz.store import RunStore

MAX_POINTS = 800  # per series on the first read; the store keeps each bucket's min and max
REREAD_FACTOR = 4  # re-read downsampled once a cached series grows past 4x MAX_POINTS
SCALAR_SERIES = ("run_id", "name")
LAYER_SERIES = ("run_id", "kind", "stat", "component", "layer")
# (after_step, max_points) -> the rows of steps after `after_step`, downsampled when set
Fetch = Callable[[int | None, int | None], pd.DataFrame]


class IncrementalReader:
    """Frames of one run kept in `state[key]` and grown by the rows logged since last read.

    `state[key]` holds `{"run_id": id, name: frame, ...}`; reading another run drops the
    frames of the one before.
    """

    def __init__(
        self,
        state: MutableMapping[str, Any],
        key: str,
        *,
        max_points: int = MAX_POINTS,
        reread_factor: int = REREAD_FACTOR,
    ) -> None:
        self.state = state
        self.key = key
        self.max_points = max_points
        self.reread_factor = reread_factor

    def _cache(self, run_id: int) -> dict[str, Any]:
        cache = self.state.get(self.key)
        if not isinstance(cache, dict) or cache.get("run_id") != run_id:
            cache = {"run_id": run_id}  # another run: drop the old run's frames
            self.state[self.key] = cache
        return cache

    def read(self, name: str, run_id: int, fetch: Fetch, series: Sequence[str]) -> pd.DataFrame:
        """The frame cached as `name` for this run, extended with the rows logged since.

        The newest cached step is read again, because a writer's flush may have landed
        only part of it; everything before it is final. A series grown past
        `reread_factor * max_points` rows is read again downsampled, so a long run does
        not slow every refresh down.
        """
        cache = self._cache(run_id)
        cached: pd.DataFrame | None = cache.get(name)
        too_long = (
            cached is not None
            and not cached.empty
            and int(cached.groupby(list(series)).size().max())
            > self.reread_factor * self.max_points
        )
        if cached is None or cached.empty or too_long:
            frame = fetch(None, self.max_points)
        else:
            last_step = int(cached["step"].max())
            fresh = fetch(last_step - 1, None)
            kept = cached[cached["step"] < last_step]
            frame = pd.concat([kept, fresh], ignore_index=True) if not fresh.empty else cached
            frame = frame.sort_values([*series, "step"], kind="stable", ignore_index=True)
        cache[name] = frame
        return frame

    def scalars(self, store: RunStore, run_id: int) -> pd.DataFrame:
        """Every scalar series of the run (`RunStore.scalars` columns)."""
        return self.read(
            "scalars",
            run_id,
            lambda after, points: store.scalars(run_id, after_step=after, max_points=points),
            SCALAR_SERIES,
        )

    def layer_stats(self, store: RunStore, run_id: int, kind: str) -> pd.DataFrame:
        """Every per-layer series of one kind (component, tap, head) of the run."""
        return self.read(
            f"layer_stats.{kind}",
            run_id,
            lambda after, points: store.layer_stats(
                run_id, kind=kind, after_step=after, max_points=points
            ),
            LAYER_SERIES,
        )
