"""`python -m blockviz params`: the parameter breakdown of a model config (no torch)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from blockviz.core import config
from blockviz.core.config_model import ModelConfig
from blockviz.core.flags import config_overrides
from blockviz.core.params import format_table, param_breakdown


def cli_main(args: argparse.Namespace) -> int:
    """`python -m blockviz params`: print the breakdown of a model config (table or JSON)."""
    base = config.preset(args.preset).model if args.preset else ModelConfig()
    overrides = config_overrides(args, ["model"])
    model_cfg = dataclasses.replace(base, **overrides).validate()
    breakdown = param_breakdown(model_cfg)
    if args.json:
        print(json.dumps(breakdown.to_dict(), indent=2))
    else:
        print(format_table(breakdown))
    return 0
