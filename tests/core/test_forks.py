"""What a fork may change, as the field registry says (core/forks.py reads it)."""

from __future__ import annotations

import pytest

from blockviz.core import config as cfg
from blockviz.core import forks
from blockviz.core.flags import UsageError


@pytest.mark.parametrize("name", [n for n, f in cfg.FIELDS.items() if f.section == "data"])
def test_a_fork_never_changes_the_text_its_checkpoint_was_trained_on(name):
    """Every data field makes the text; ops_seed once slipped through (the hand-kept tuple
    named four of the five ops fields), so a fork could train on another ops text."""
    value = "shakespeare" if name == "dataset" else "3"
    with pytest.raises(UsageError, match=f"--{name} cannot change in a fork"):
        forks.fork_overrides(((name, value),))


def test_the_fork_panel_offers_fields_a_fork_takes():
    assert {"lr", "max_steps", "logit_softcap"} <= set(forks.OFFERED_FIELDS)
    given = tuple((name, "0.5" if name == "dropout" else "1") for name in ("lr", "dropout"))
    assert forks.fork_overrides(given) == {"lr": 1.0, "dropout": 0.5}


def _zipped_pickle(path, value) -> None:
    """A file laid out as torch.save writes one: a zip holding `<name>/data.pkl`."""
    import pickle
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(value))


def test_a_checkpoint_step_is_read_without_torch_and_without_running_what_it_names(tmp_path):
    good = tmp_path / "last.ckpt"
    _zipped_pickle(good, {"global_step": 20, "state_dict": {"w": [1.0]}})
    assert forks.checkpoint_step(good) == 20

    class Runs:  # pickled by reference: unpickling it would call os.system
        def __reduce__(self):
            import os

            return (os.system, (f"touch {tmp_path / 'ran'}",))

    hostile = tmp_path / "hostile.ckpt"
    _zipped_pickle(hostile, {"global_step": 7, "x": Runs()})
    assert forks.checkpoint_step(hostile) == 7
    assert not (tmp_path / "ran").exists()

    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:40])
    _zipped_pickle(tmp_path / "no-step.ckpt", {"epoch": 1})
    for path in (truncated, tmp_path / "no-step.ckpt", tmp_path / "missing.ckpt"):
        assert forks.checkpoint_step(path) is None
