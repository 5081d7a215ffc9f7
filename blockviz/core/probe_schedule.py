"""Which steps a run probes: step 0, every `probe_interval` steps, and the last trained step.

The probes (`training.probes`) ask it step by step; the findings and the study checks
list every probed step of a run in advance.
"""

from __future__ import annotations


def is_probe_step(step: int, probe_interval: int, last_step: int | None) -> bool:
    """Whether a run probes at `step`: step 0, every `probe_interval` steps, and the last
    trained step (max_steps - 1, the last batch with a gradient; None when unknown)."""
    return step % probe_interval == 0 or step == last_step


def probe_steps(max_steps: int, probe_interval: int) -> list[int]:
    """Every step a run of `max_steps` steps probes (`is_probe_step`), in order; by
    arithmetic, since Live's findings ask for it at every refresh of runs of any length."""
    steps = list(range(0, max_steps, probe_interval))
    if max_steps > 0 and steps[-1] != max_steps - 1:
        steps.append(max_steps - 1)
    return steps
