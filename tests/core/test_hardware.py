"""Run slots and each run's CPU threads (blockviz.core.hardware), on machines of any size."""

from __future__ import annotations

import pytest

from blockviz.core import hardware


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    """Pretend to be a machine with `cores` cores and `gpus` visible GPUs."""

    def become(cores: int, gpus: int = 0, env_slots: str | None = None) -> None:
        monkeypatch.setattr(hardware, "cpu_cores", lambda: cores)
        monkeypatch.setattr(hardware, "visible_gpus", lambda: gpus)
        if env_slots is None:
            monkeypatch.delenv(hardware.ENV_SLOTS, raising=False)
        else:
            monkeypatch.setenv(hardware.ENV_SLOTS, env_slots)

    return become


@pytest.mark.parametrize(
    ("cores", "gpus", "env_slots", "max_running", "slots", "threads"),
    [
        (2, 0, None, 0, 2, 1),  # the dev box: a slot per core, one thread each
        (16, 0, None, 0, 16, 1),
        (16, 0, "4", 0, 4, 4),  # fewer slots, a bigger share
        (16, 0, None, 2, 16, 8),  # train --max_running 2: half the cores each
        (16, 2, None, 0, 2, 8),  # a slot per GPU and half the cores for each
        (16, 8, None, 0, 8, 2),
        (3, 0, "5", 0, 5, 1),  # more slots than cores: still at least one thread
        (16, 0, "zero", 0, 16, 1),  # a bad override is ignored
    ],
)
def test_each_run_takes_the_cores_divided_by_the_slots(
    machine, cores, gpus, env_slots, max_running, slots, threads
) -> None:
    machine(cores, gpus, env_slots)
    assert hardware.default_slots() == slots
    assert hardware.default_threads(max_running) == threads


def test_threads_are_named_as_show_prints_them() -> None:
    assert hardware.threads_text(1) == "1 thread"
    assert hardware.threads_text(8) == "8 threads"
    assert hardware.share_of_cores(0) >= 1  # a nonsense slot count never divides by zero


@pytest.mark.parametrize(
    ("cores", "gpus", "env_slots", "source"),
    [
        (2, 0, None, "one per CPU core: this machine has 2"),
        (16, 2, None, "one per GPU: this machine has 2"),
        (16, 2, "4", "BLOCKVIZ_MAX_RUNNING=4"),
        (16, 0, "zero", "one per CPU core: this machine has 16"),  # ignored, as above
    ],
)
def test_the_time_estimates_say_where_the_slot_count_comes_from(
    machine, cores, gpus, env_slots, source
) -> None:
    machine(cores, gpus, env_slots)
    assert hardware.slots_source() == source
