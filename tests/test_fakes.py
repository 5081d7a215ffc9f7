"""The fake runs of tests/fakes.py have the shapes real runs have, and carry no claims."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from blockviz.core import config as cfg
from blockviz.core import spec
from blockviz.store import RunStore
from tests import fakes
from tests.real_runs import RUNS, RealRuns

# Toggles that change which tensors and taps exist (tiny sizes: only names matter here).
MODEL_VARIANTS = [
    {},
    {"norm_position": "post"},
    {"norm_position": "none"},
    {"norm_type": "rmsnorm"},
    {"bias": False},
    {"attention": False},
    {"ffn": False},
    {"activation": "swiglu"},
    {"tie_weights": True},
    {"final_norm": False},
    {"norm_position": "post", "final_norm": True, "attention": False, "tie_weights": True},
    {"qk_norm": True},
    {"qk_norm": True, "norm_type": "rmsnorm", "norm_position": "none"},
    {"qk_norm": True, "norm_type": "batchnorm"},
]


@pytest.mark.parametrize("overrides", MODEL_VARIANTS, ids=str)
def test_param_and_tap_names_are_the_real_models(overrides: dict[str, Any]) -> None:
    from blockviz.core.params import param_component
    from blockviz.core.spec import block_tap_names
    from blockviz.training.model import CharTransformer

    model_cfg = fakes.fake_config(n_layer=2, n_head=2, d_model=16, **overrides).model
    model = CharTransformer(model_cfg)
    real = [
        (name, *param_component(name, model_cfg.n_layer), param.ndim == 2)
        for name, param in model.named_parameters()
        if param.requires_grad
    ]
    fake = [(t.name, t.layer, t.component, t.matrix) for t in fakes.param_tensors(model_cfg)]
    assert fake == real
    # The taps the fakes write (the spec's rule) are the modules the real model builds.
    for block in model.blocks:
        assert tuple(block.taps) == block_tap_names(model_cfg)


def covered_size(bins: pd.DataFrame, outside: float) -> int:
    """The number of values a histogram covers: its counts, and the share outside its range."""
    return round(bins["count"].sum() / (1 - outside))


def shape(store: RunStore, run_id: int) -> dict[str, Any]:
    """Everything about a stored run except its values: names, steps, keys, sizes."""
    run = store.get_run(run_id)
    scalars = store.scalars(run_id)
    layers = store.layer_stats(run_id)
    hists = store.histograms(run_id)
    samples = store.samples(run_id)
    maps = {}
    for step in store.attention_steps(run_id):
        frame = store.attention(run_id, step)
        for (layer, head), one in frame.groupby(["layer", "head"]):
            first_row = one[one["query"] == one["query"].max()].sort_values("key")
            maps[(step, layer, head)] = "".join(first_row["key_char"])
    shares = layers[layers["stat"].isin([spec.BELOW_RANGE, spec.ABOVE_RANGE])]
    outside = shares.groupby(["step", "layer", "component"])["value"].sum().to_dict()
    final = run.final or {}
    dataset = {k: v for k, v in (run.dataset or {}).items() if k != "source"}
    return {
        "run": {k: v is not None for k, v in run.to_dict().items()},
        "status": (run.status, run.step, run.max_steps, run.diverged_step),
        "n_params": run.n_params,
        "final": {k: v is not None for k, v in final.items()},
        "dataset": dataset,
        "scalars": {
            name: sorted(group["step"]) for name, group in scalars.groupby("name", sort=True)
        },
        "layer_stats": sorted(
            layers[["step", "layer", "kind", "component", "stat"]].itertuples(index=False)
        ),
        # The bins with the shares below and above their range cover the activation's size,
        # except where the activations are not finite (the step a run diverged at: NaN lands
        # in no bin and on neither side), so the size is left out there.
        "histograms": {
            key: (len(one), one["lo"].min(), one["hi"].max(), covered_size(one, outside[key]))
            if key[0] != run.diverged_step
            else len(one)
            for key, one in hists.groupby(["step", "layer", "tap"])
        },
        "attention": maps,
        "samples": sorted(
            zip(samples["step"], samples["prompt"], samples["text"].str.len(), strict=True)
        ),
    }


@pytest.mark.parametrize("label", list(RUNS))
def test_a_fake_run_has_the_shape_of_the_real_run(
    real_runs: RealRuns, tmp_path, label: str
) -> None:
    with RunStore(real_runs.path, readonly=True) as real_store:
        real = real_store.get_run(real_runs.ids[label])
        expected = shape(real_store, real.id)
    config = cfg.RunConfig.from_dict(real.config)
    with RunStore(tmp_path / "fake.db") as store:
        fake_id = fakes.add_run(store, config, real.status, step=real.step)
        store.flush()
        got = shape(store, fake_id)
    for part in expected:
        assert got[part] == expected[part], part


def test_the_real_runs_cover_what_the_fakes_must_match(real_runs: RealRuns) -> None:
    with RunStore(real_runs.path, readonly=True) as store:
        runs = store.runs_frame().set_index("id")
        ffn_only = real_runs.ids["ffn_only"]
        assert runs.loc[real_runs.ids["diverged"], "status"] == "diverged"
        assert runs.loc[real_runs.ids["pre"], "status"] == "completed"
        # Attention off: no head rows and no maps; tied weights: no lm_head tensor.
        assert store.attention_steps(ffn_only) == []
        params = store.layer_stats(ffn_only, kind="param")
        assert "lm_head.weight" not in set(params["component"])
        # Step 0 has update ratios: its optimizer step is measured like any other.
        ratios = store.layer_stats(real_runs.ids["pre"], kind="component", stat="update_ratio")
        assert 0 in set(ratios["step"])


def _values(store: RunStore, run_id: int) -> pd.Series:
    stats = store.layer_stats(run_id)
    # Sums over tensors (components, the global gradient norm) differ where the tensors do,
    # and train/lr is the config's own lr.
    stats = stats[stats["kind"] != "component"]
    keys = ["step", "layer", "kind", "component", "stat"]
    scalars = store.scalars(run_id)
    scalars = scalars[~scalars["name"].isin(["train/lr", "train/grad_norm"])]
    return pd.concat([stats.set_index(keys)["value"], scalars.set_index(["step", "name"])["value"]])


@pytest.mark.parametrize(
    "other",
    [
        {"norm_position": "post", "lr": 3e-3, "warmup_steps": 0},
        {"n_layer": 6},  # layer 1 is no longer the last: its numbers must not care
        {"residual": False, "activation": "relu", "init": "gpt2"},
    ],
    ids=str,
)
def test_fake_numbers_do_not_depend_on_the_config_or_the_depth(
    tmp_path, other: dict[str, Any]
) -> None:
    base = {"n_layer": 2, "n_head": 2, "d_model": 16, "max_steps": 40, "warmup_steps": 4}
    base["probe_interval"] = 10
    with RunStore(tmp_path / "s.db") as store:
        first = fakes.add_run(store, fakes.fake_config(**base), seed=3)
        second = fakes.add_run(store, fakes.fake_config(**{**base, **other}), seed=3)
        store.flush()
        one, two = _values(store, first), _values(store, second)
    shared = one.index.intersection(two.index)
    assert len(shared) > 0.5 * len(one)
    pd.testing.assert_series_equal(one[shared], two[shared])


def test_fake_runs_are_complete_and_deterministic(tmp_path) -> None:
    statuses = ("completed", "running", "diverged", "failed", "queued")
    frames = []
    for name in ("a.db", "b.db"):
        with RunStore(tmp_path / name) as filled:
            ids = fakes.populate(
                filled, n_runs=5, n_steps=120, n_layer=3, statuses=statuses, probe_every=20
            )
            assert filled.reap_dead() == []  # running and queued runs look alive
            frames.append(filled.scalars(ids))
            runs = filled.runs_frame().set_index("id")
            assert runs["status"].tolist() == list(statuses)
            diverged = ids[2]
            assert runs.loc[diverged, "train_loss"] == math.inf
            assert runs.loc[diverged, "diverged_step"] == filled.max_step(diverged)
            assert filled.get_run(ids[3]).error
            assert filled.get_run(ids[0]).config["model"]["n_layer"] == 3
            at_init = filled.layer_stats(ids[0], kind="component", stat="grad_norm", step=0)
            assert {-1, 0, 1, 2, 3} == set(at_init["layer"])
            assert {"attn", "ffn", "norm", "block"} <= set(at_init["component"])
            taps = filled.layer_stats(ids[0], kind="tap", step=0)
            extras = len(spec.STREAM_STATS) + len(spec.FFN_UNIT_STATS)  # resid_post, ffn_hidden
            assert len(taps) == 3 * (len(spec.TAPS) * len(spec.TAP_STATS) + extras)
            ratios = filled.layer_stats(ids[0], kind="component", stat="update_ratio")
            # every probe_every steps and the last trained step, as BlockProbe probes
            assert set(ratios["step"]) == {*range(0, 120, 20), 119}
            assert (ratios["value"] > 0).all() and ratios["value"].map(math.isfinite).all()
            assert not filled.attention(ids[0]).empty and not filled.samples(ids[0]).empty
            assert not filled.histograms(ids[0]).empty
    pd.testing.assert_frame_equal(frames[0], frames[1])


def test_populate_refuses_what_it_cannot_fake(tmp_path) -> None:
    with RunStore(tmp_path / "s.db") as store, pytest.raises(ValueError, match="n_steps=0"):
        fakes.populate(store, n_steps=0)
