"""The Plan as a value (core.plans): its first line, its lr-horizon note, a resume's rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockviz.core import config as cfg
from blockviz.core.flags import UsageError
from blockviz.core.plans import Fork, Member, Plan, resume_overrides, schedule_horizon
from tests.helpers import tiny_config


def test_the_first_line_says_which_runs_do_what():
    config = tiny_config(max_steps=100)
    solo = Plan((Member(config, "tiny", 3),))
    assert solo.start_text() == "run 3 (tiny) started"
    resumed = Plan((Member(config, "tiny", 3),), checkpoint=Path("last.ckpt"), start_step=40)
    assert resumed.start_text() == "run 3 (tiny) resuming from step 40"
    finishing = Plan((Member(config, "tiny", 3),), checkpoint=Path("last.ckpt"), start_step=100)
    assert finishing.start_text().startswith("run 3 (tiny) finishing: its last checkpoint")
    fork = Plan((Member(config, "f", 9),), start_step=20, fork=Fork(3, "replay", {}))
    assert fork.start_text() == "run 9 (f) replay of run 3 from step 20"
    members = (
        Member(config, "a", 4),
        Member(config, "b", 5, finished=True),
        Member(config, "c", 6),
    )
    batch = Plan(members, checkpoint=Path("last.ckpt"), start_step=40)
    assert batch.start_text() == "runs 4, 6 (2 replicas of one batch) resuming from step 40"


def test_a_resume_past_its_horizon_says_where_the_lr_decay_ends():
    config = tiny_config(max_steps=200, lr_schedule="cosine")
    assert Plan((Member(config, "a"),)).horizon_note() is None
    assert Plan((Member(config, "a"),), schedule_steps=200).horizon_note() is None
    note = Plan((Member(config, "a"),), schedule_steps=100).horizon_note()
    assert note.startswith("the cosine lr schedule keeps its horizon of 100 steps")
    constant = cfg.replace(config, lr_schedule="constant")
    assert Plan((Member(constant, "a"),), schedule_steps=100).horizon_note() is None


def test_a_resume_may_change_hardware_and_cadence_not_the_maths():
    assert resume_overrides((("max_steps", "300"), ("log_interval", "5"))) == {
        "max_steps": 300,
        "log_interval": 5,
    }
    with pytest.raises(UsageError, match="--lr cannot change on --resume"):
        resume_overrides((("lr", "0.1"),))


def test_the_lr_horizon_is_the_checkpoints_not_a_larger_max_steps():
    config = tiny_config(max_steps=500)
    assert schedule_horizon({"hyper_parameters": {"schedule_steps": 120}}, config) == 120
    first = {"run_config": {"train": {"max_steps": 200}}}
    assert schedule_horizon({"hyper_parameters": first}, config) == 200
    batch = {"run_configs": [{"train": {"max_steps": 250}}]}
    assert schedule_horizon({"hyper_parameters": batch}, config) == 250
    assert schedule_horizon({"hyper_parameters": {}}, config) == 500
