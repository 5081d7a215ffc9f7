"""AppTest of twins: Compare draws a fork as differences from its parent; Live offers Fork
and Replay from the run's kept checkpoints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from blockviz import cli
from blockviz.core import forks
from blockviz.dashboard.fork_panel import default_step
from blockviz.store import RunStore
from tests import fakes
from tests.helpers import shown

PAGES = Path(__file__).resolve().parents[2] / "pages"


@pytest.fixture
def store() -> RunStore:
    opened = RunStore(os.environ["BLOCKVIZ_STORE"])
    yield opened
    opened.close()


def _frames(at: AppTest, titled: str) -> list:
    """The data frames of every chart whose title holds `titled`."""
    frames = []
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        title = spec.get("title")
        title = title.get("text") if isinstance(title, dict) else title
        if titled in str(title):
            frames += [
                pa.ipc.open_stream(d.data.data).read_all().to_pandas()
                for d in element.proto.datasets
            ]
    return frames


def _twin_frames(at: AppTest) -> list:
    return _frames(at, " − ")


def test_compare_draws_a_twin_as_its_differences_from_the_parent(store: RunStore) -> None:
    parent, twin = fakes.populate(
        store, n_runs=2, n_steps=60, n_layer=2, probe_every=10, n_head=2, statuses=["completed"] * 2
    )
    store.update_run(
        twin, parent_id=parent, fork_step=20, fork_kind="fork", fork_info={"changes": {"lr": 0.003}}
    )
    at = AppTest.from_file(str(PAGES / "compare.py"), default_timeout=60)
    at.session_state["compare_ids"] = [parent, twin]
    at.run()
    assert not at.exception
    assert any("Twins" in s.value for s in at.subheader)
    frames = [f for f in _twin_frames(at) if "difference" in f.columns]
    assert frames, "no difference chart drawn"
    drawn = frames[0]
    assert drawn["step"].min() >= 20
    assert (drawn["difference"] == drawn["twin"] - drawn["parent"]).all()
    captions = shown(" ".join(c.value for c in at.caption))
    assert "(lr 0.003)" in captions
    # Its step-0 rows are its parent's: not drawn at initialization as the fork's own.
    assert (
        "Left out, forks whose step-0 gradients are their parent's: fake-1 (from step 20)"
        in captions
    )
    init = [f for f in _frames(at, "initialization") if "run_id" in f.columns]
    assert init and set(init[0]["run_id"]) == {parent}
    # Per block: the gradient norm's differences, one series per block.
    at.segmented_control(key="compare.twin.metric").set_value("gradient norm per block").run()
    assert not at.exception
    blocks = next(f for f in _twin_frames(at) if "difference" in f.columns)
    assert set(blocks["series"]) >= {"block 0", "block 1"}


def test_live_says_whose_fork_a_run_is(store: RunStore) -> None:
    parent, twin = fakes.populate(
        store, n_runs=2, n_steps=60, n_layer=2, statuses=["completed"] * 2
    )
    store.update_run(
        twin, parent_id=parent, fork_step=20, fork_kind="fork", fork_info={"changes": {"lr": 0.003}}
    )
    at = AppTest.from_file(str(PAGES / "live.py"), default_timeout=60)
    at.session_state["run_id"] = twin
    at.run()
    assert not at.exception
    captions = shown(" ".join(c.value for c in at.main.caption))
    assert f"A fork of #{parent} fake-0 from step 20 (lr 0.003)" in captions


def test_a_fork_starts_by_default_from_the_newest_kept_step_before_max_steps() -> None:
    assert default_step([100, 200, 300], 300) == 200
    assert default_step([100, 200, 300], 1000) == 300
    assert default_step([300], 300) == 300


def test_live_offers_a_fork_from_the_kept_steps(store: RunStore) -> None:
    (run_id,) = fakes.populate(store, n_runs=1, n_steps=60, n_layer=2, statuses=["completed"])
    folder = store.run_dir(run_id) / forks.CHECKPOINTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for step in (20, 40):
        (folder / forks.kept_name(step)).write_bytes(b"")
    at = AppTest.from_file(str(PAGES / "live.py"), default_timeout=60)
    at.session_state["run_id"] = run_id
    at.run()
    assert not at.exception
    choice = [s for s in at.sidebar.selectbox if s.label == "From the kept step"]
    assert choice and choice[0].options == ["20", "40"] and choice[0].value == 40
    assert any(b.label == "Fork" for b in at.sidebar.button)


def test_the_fork_panel_draws_whatever_kind_of_field_the_registry_offers(
    store: RunStore, monkeypatch
) -> None:
    """Fields come from the registry: an offered on/off or auto/on/off field is a toggle or
    a menu (the panel once drew only words and numbers, so a boolean hid the Fork button)."""
    monkeypatch.setattr(forks, "OFFERED_FIELDS", ("qk_norm", "final_norm", "lr"))
    (run_id,) = fakes.populate(store, n_runs=1, n_steps=60, n_layer=2, statuses=["completed"])
    folder = store.run_dir(run_id) / forks.CHECKPOINTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / forks.kept_name(20)).write_bytes(b"")
    at = AppTest.from_file(str(PAGES / "live.py"), default_timeout=60)
    at.session_state["run_id"] = run_id
    at.run()
    assert not at.exception
    assert [t.label for t in at.sidebar.toggle] == ["QK-norm"]
    assert any(s.label == "Final norm" and s.value == "auto" for s in at.sidebar.selectbox)
    assert any(b.label == "Fork" for b in at.sidebar.button)


def test_live_says_when_a_run_keeps_no_checkpoints(store: RunStore) -> None:
    (run_id,) = fakes.populate(store, n_runs=1, n_steps=60, n_layer=2, statuses=["completed"])
    at = AppTest.from_file(str(PAGES / "live.py"), default_timeout=60)
    at.session_state["run_id"] = run_id
    at.run()
    assert not at.exception
    assert any("No kept checkpoints" in c.value for c in at.sidebar.caption)
    assert not any(b.label == "Fork" for b in at.sidebar.button)


@pytest.mark.slow
def test_fork_from_live_trains_a_twin_that_compare_draws(store: RunStore, tmp_path) -> None:
    """The Done-when path: a Post-LN run forked from Live with norm_position pre."""
    corpus = tmp_path / "fox.txt"
    corpus.write_text(fakes.CORPUS, encoding="utf-8")
    flags = ("--dataset", str(corpus), "--store", str(store.location.text), "--threads", "1")
    post = (
        "--preset",
        "tiny",
        "--norm_position",
        "post",
        "--max_steps",
        "20",
        "--ckpt_interval",
        "10",
    )
    assert cli.main(["train", *post, *flags, "--no_progress"]) == 0
    at = AppTest.from_file(str(PAGES.parent / "app.py"), default_timeout=60)  # links need it
    at.session_state["run_id"] = 1
    at.run()
    at.switch_page("pages/live.py").run()
    step = next(s for s in at.sidebar.selectbox if s.label == "From the kept step")
    step.set_value(10).run()
    at.sidebar.selectbox(key="live.1.fork.norm_position").set_value("pre").run()
    next(b for b in at.sidebar.button if b.label == "Fork").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    said = " ".join(shown(s.value) for s in at.success)
    assert "Fork of #1 " in said and "from step 10 (norm_position pre) started as run #2 " in said
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = store.runs_frame()
        if len(runs) == 2 and runs["status"].iloc[1] in ("completed", "failed"):
            break
        time.sleep(0.5)
    twin = store.get_run(2)
    assert (twin.status, twin.parent_id, twin.fork_step) == ("completed", 1, 10)
    assert twin.fork_info == {"changes": {"norm_position": "pre"}}
    compare = AppTest.from_file(str(PAGES / "compare.py"), default_timeout=60)
    compare.session_state["compare_ids"] = [1, 2]
    compare.run()
    drawn = next(f for f in _twin_frames(compare) if "difference" in f.columns)
    assert drawn["step"].min() >= 10 and drawn["difference"].abs().max() > 0


# A stand-in for `python -m blockviz fork`: registers the twin as registration does (its
# own pid), then keeps training (sleeps) until the test stops it.
REGISTERS = (
    "import os, sys, time\n"
    "from blockviz.store import RunStore\n"
    "with RunStore(sys.argv[1]) as store:\n"
    "    store.create_run('fake-0 fork@20 lr=0.003', '{}', parent_id=int(sys.argv[2]),\n"
    "                     fork_step=20, fork_kind='fork', status='running', pid=os.getpid())\n"
    "time.sleep(60)\n"
)


def test_fork_from_live_names_the_twin_links_it_and_opens_it(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35, 10: the message names the twin (id and name), links it, and a button opens
    it on Live; before, it named no run and Live stayed on the parent."""
    from blockviz.launch import forking

    (parent,) = fakes.populate(store, n_runs=1, n_steps=60, n_layer=2, statuses=["completed"])
    folder = store.run_dir(parent) / forks.CHECKPOINTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / forks.kept_name(20)).write_bytes(b"")
    fake = [sys.executable, "-c", REGISTERS, str(store.location.text), str(parent)]
    monkeypatch.setattr(forking, "fork_command", lambda *args: fake)
    at = AppTest.from_file(str(PAGES.parent / "app.py"), default_timeout=60)  # links need it
    at.session_state["run_id"] = parent
    at.run()
    at.switch_page("pages/live.py").run()
    next(b for b in at.sidebar.button if b.label == "Fork").click().run()
    twins = store.twins_of(parent)
    try:
        assert not at.exception and not at.error, [e.value for e in at.error]
        (twin,) = twins
        said = " ".join(shown(s.value) for s in at.success)
        assert f"started as run #{twin.id} {twin.name}." in said
        links = [e.proto for e in at.get("page_link")]
        assert any(
            link.page.endswith("live")
            and f"run={twin.id}" in link.query_string
            and shown(link.label) == f"#{twin.id} {twin.name}"
            for link in links
        ), links
        next(b for b in at.button if b.label == "Open in Live").click().run()
        assert at.session_state["run_id"] == twin.id
        assert shown(at.subheader[0].value) == f"#{twin.id} {twin.name}"  # Live shows it
        assert not at.success  # the news is spent
    finally:
        for twin in twins:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(twin.pid, signal.SIGTERM)
