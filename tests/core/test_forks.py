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
