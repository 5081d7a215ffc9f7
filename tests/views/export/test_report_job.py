"""ReportJob: the state a page polls while a download's worker thread builds the report."""

from __future__ import annotations

import threading

import pytest

from blockviz.views.export.report_job import JobStatus, ReportJob


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def start_slow_build(job: ReportJob) -> tuple[threading.Thread, threading.Event]:
    """A build running in its worker thread until `finish` is set."""
    started, finish = threading.Event(), threading.Event()

    def slow(progress) -> bytes:
        started.set()
        finish.wait(10)
        return b"zip"

    worker = threading.Thread(target=job.builder(slow, [1]))
    worker.start()
    started.wait(10)
    return worker, finish


def test_a_new_job_is_idle() -> None:
    assert ReportJob().status() == JobStatus(False, 0.0, "", "", 0, ())


def test_a_click_builds_reports_progress_and_ends_with_the_size() -> None:
    job = ReportJob()
    halfway, release = threading.Event(), threading.Event()

    def build(progress) -> bytes:
        progress(0.5, "charts")
        halfway.set()
        release.wait(10)
        progress(1.7, "zip")  # clamped to 1
        return b"x" * 2000

    job.request()  # the button's on_click
    assert job.building()
    built: list[bytes] = []
    worker = threading.Thread(target=lambda: built.append(job.builder(build, [3, 1])()))
    worker.start()
    assert halfway.wait(10)
    status = job.status()
    assert status.building and status.fraction == 0.5 and status.message == "charts"
    assert status.run_ids == (3, 1)
    release.set()
    worker.join(10)
    status = job.status()
    assert built == [b"x" * 2000] and not status.building
    assert status.size == 2000 and status.error == "" and status.fraction == 1.0


def test_the_build_may_start_before_the_click_is_seen() -> None:
    job = ReportJob()
    worker, finish = start_slow_build(job)
    assert job.building()  # started, not yet requested: still building
    job.request()
    finish.set()
    worker.join(10)
    assert not job.building()  # one request, one start, one finish


def test_an_error_in_the_build_is_recorded_and_raised() -> None:
    job = ReportJob()
    job.request()

    def build(progress) -> bytes:
        progress(0.3, "charts")
        raise RuntimeError("vl-convert is missing")

    with pytest.raises(RuntimeError, match="vl-convert"):
        job.builder(build, [1, 2])()
    status = job.status()
    assert not status.building
    assert status.error == "vl-convert is missing" and status.size == 0


def test_an_error_without_a_message_is_named_by_its_type() -> None:
    job = ReportJob()

    def build(progress) -> bytes:
        raise MemoryError

    with pytest.raises(MemoryError):
        job.builder(build, [1])()
    assert job.status().error == "MemoryError"


def test_a_new_build_clears_the_last_error() -> None:
    job = ReportJob()
    with pytest.raises(ValueError):
        job.builder(lambda progress: (_ for _ in ()).throw(ValueError("bad")), [1])()
    assert job.builder(lambda progress: b"ok", [2])() == b"ok"
    status = job.status()
    assert status.error == "" and status.size == 2 and status.run_ids == (2,)


def test_a_request_whose_build_never_starts_stalls_after_the_timeout() -> None:
    clock = Clock()
    job = ReportJob(stall_s=120.0, clock=clock)
    job.request()
    clock.now += 119.0
    assert job.building()
    clock.now += 2.0
    assert not job.building()  # the browser dropped the download: stop polling
    assert not job.status().building


def test_a_started_build_never_stalls() -> None:
    clock = Clock()
    job = ReportJob(stall_s=1.0, clock=clock)
    job.request()
    worker, finish = start_slow_build(job)
    clock.now += 3600.0
    assert job.building()  # a long build is still a build
    finish.set()
    worker.join(10)
    assert not job.building()


def test_the_last_good_build_is_kept_for_its_runs_only() -> None:
    job = ReportJob()
    assert job.result([1, 2]) is None
    job.builder(lambda progress: b"zip bytes", [1, 2])()
    assert job.result([1, 2]) == b"zip bytes"
    assert job.result([2, 1]) is None and job.result([1]) is None
    with pytest.raises(RuntimeError):
        job.builder(lambda progress: (_ for _ in ()).throw(RuntimeError("x")), [1, 2])()
    assert job.result([1, 2]) is None  # a failed build leaves nothing to save
