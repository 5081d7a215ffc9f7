"""Optional packages: what a setting needs that `make run` does not install.

Checked where a user chooses the setting (the sidebar, `train`), so a run never starts
only to fail on a missing import.
"""

from __future__ import annotations

import importlib.util

from blockviz.core.config_train import TrainConfig
from blockviz.core.fields import ConfigError


def check_logger_available(train: TrainConfig) -> None:
    """ConfigError naming the missing package when `train.logger` cannot write here."""
    if train.logger != "tensorboard":
        return
    # Lightning's TensorBoardLogger writes with either package.
    if not any(importlib.util.find_spec(name) for name in ("tensorboard", "tensorboardX")):
        raise ConfigError(
            "logger",
            train.logger,
            "install the tensorboard package",
            message="--logger tensorboard needs the tensorboard package, which is not "
            "installed: pip install tensorboard",
        )
