"""Config fields that do nothing under the rest of the config.

A field is inert when changing it cannot change the run: Norm type with norm position none
builds no norm at all. The sidebar greys such a widget out (saying why) and the suggested
run name leaves it out, so `no-norm-rmsnorm` never names a model without an RMSNorm.
Read off the code that uses each field: training/model.py (which modules exist),
training/lit.py's `lr_at` (the schedule) and core/corpora.py (the ops generator);
tests/core/test_inert.py checks each claim against that code.
"""

from __future__ import annotations

from dataclasses import fields

from blockviz.core.config import RunConfig
from blockviz.core.config_train import DataConfig

OPS_FIELDS = tuple(f.name for f in fields(DataConfig) if f.name.startswith("ops_"))


def inert_fields(run_config: RunConfig) -> dict[str, str]:
    """{field: why it does nothing here} for every field the rest of `run_config` ignores."""
    model = run_config.model
    inert: dict[str, str] = {}
    qk_norms = model.qk_norm and model.attention  # their type follows norm_type too
    if model.norm_position == "none":
        if not qk_norms:
            inert["norm_type"] = "norm position is none: the model has no norm to choose a type for"
        inert["final_norm"] = "norm position is none: there is no final norm either"
    if not model.ffn:
        inert["activation"] = "the FFN is off: no activation runs"
        inert["ffn_mult"] = "the FFN is off: there is no FFN width"
    if not model.attention:
        inert["n_head"] = "attention is off: there are no heads"
        inert["qk_norm"] = "attention is off: there are no queries or keys to normalise"
    if run_config.train.lr_schedule == "constant":
        inert["min_lr"] = "the schedule is constant: the learning rate never decays to it"
    if run_config.data.dataset != "ops":
        for name in OPS_FIELDS:
            inert[name] = "only the ops dataset reads it"
    return inert
