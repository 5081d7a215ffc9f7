"""BlockProbe: what a probe step records, that the numbers agree, and that hooks never linger."""

import copy
import dataclasses
import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.overrides import TorchFunctionMode

from blockviz.core import config as cfg
from blockviz.core import spec
from blockviz.core.probe_schedule import probe_steps
from blockviz.core.spec import HIST_RANGE, STREAM_STATS, TAP_STATS
from blockviz.store import RunStore
from blockviz.training import probe_stats
from blockviz.training.lit import LitCharModel
from blockviz.training.model import CharTransformer, block_tap_names, capture_attention
from blockviz.training.probe_stats import (
    attention_entropy,
    ffn_unit_statistics,
    output_statistics,
    stream_statistics,
    tap_statistics,
)
from blockviz.training.probes import BlockProbe, tap_hooks
from blockviz.training.sinks import ProbeRecords, StoreSink
from blockviz.training.trainer import make_trainer, quiet_lightning
from tests import helpers

torch.set_num_threads(1)


VARIANTS = {
    "pre-ln": {},
    "post-ln-relu": {"norm_position": "post", "activation": "relu"},
    "no-norm": {"norm_position": "none"},
    "ffn-only": {"attention": False},
    "attention-only": {"ffn": False},
    "swiglu-rmsnorm": {"activation": "swiglu", "norm_type": "rmsnorm"},
}


def tiny_config(**overrides) -> cfg.RunConfig:
    # grad_clip tiny, so a norm recorded after clipping would give itself away
    base = {"warmup_steps": 1, "eval_iters": 1, "grad_clip": 1e-3}
    return helpers.tiny_config(**{**base, **overrides})


def all_taps(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [tap for block in model.blocks for tap in block.taps.values()]


# ---------------------------------------------------------------------------- tap hooks


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tap_hooks_see_every_present_tap_and_leave_none_behind(variant):
    config = tiny_config(**VARIANTS[variant])
    model = CharTransformer(config.model)
    x = torch.randint(config.model.vocab_size, (2, 8))
    with tap_hooks(model) as acts:
        assert all(tap._forward_hooks for tap in all_taps(model))
        model(x)
    expected = {(layer, tap) for layer in range(2) for tap in block_tap_names(config.model)}
    assert set(acts) == expected
    d_ff = config.model.d_ff
    assert all(acts[key].shape[-1] in (16, d_ff) for key in acts)
    assert not any(tap._forward_hooks for tap in all_taps(model))


def test_tap_hooks_are_removed_when_the_forward_fails():
    model = CharTransformer(tiny_config().model)
    with pytest.raises(ValueError), tap_hooks(model):
        model(torch.zeros(1, 99, dtype=torch.long))  # longer than block_size
    assert not any(tap._forward_hooks for tap in all_taps(model))


def test_tap_statistics_values_and_histogram_of_the_values_inside_its_range():
    x = torch.tensor([-10.0, -8.0, -1.0, 0.0, 0.0, 1.0, 3.0, 8.0, 10.0, 12.0])
    stats = tap_statistics(x[None], bins=4, value_range=(-8.0, 8.0))[0]  # a stack of one
    width = len(TAP_STATS)
    values = dict(zip(TAP_STATS, stats[:width].tolist(), strict=True))
    assert values["mean"] == pytest.approx(1.5)
    assert values["std"] == pytest.approx(x.std(unbiased=False).item())
    assert values["rms"] == pytest.approx(math.sqrt(sum(v * v for v in x.tolist()) / 10))
    assert values["max_abs"] == 12.0
    assert values["zero_frac"] == pytest.approx(2 / 10)
    # -10 lies below the range, 10 and 12 above it: counted apart, in no bin
    assert values["below_range"] == pytest.approx(1 / 10)
    assert values["above_range"] == pytest.approx(2 / 10)
    # bins [-8,-4) [-4,0) [0,4) [4,8]: both ends belong to the range
    counts = stats[width:].tolist()
    assert counts == [1.0, 1.0, 4.0, 1.0]
    outside = (values["below_range"] + values["above_range"]) * x.numel()
    assert sum(counts) + round(outside) == x.numel()


def test_statistics_are_filed_by_name_whatever_the_order_of_their_tuples(monkeypatch):
    """Each statistic is computed under its registry name and read back with the tuple it
    was stacked in: reordering TAP_STATS, STREAM_STATS or ATTENTION_HEAD_STATS relabels
    nothing, and a tuple that misses a computed statistic fails instead of shifting the others."""
    # (B, T, C), every statistic a different value: a swap of two shows
    x = torch.tensor([[[-10.0, -1.0, 0.0], [0.25, 3.0, 12.0]], [[13.0, 14.0, 0.5], [2, 0, 1.25]]])
    heads = [torch.tensor([[[1.0, 2.0]]]) * k for k in (1, 3, 5)]  # (K, L, nh) each

    def filed() -> set[tuple[str, str, float]]:
        tapped = tap_statistics(x[None], 4)[0].tolist()
        taps, _ = probe_stats.tap_records(0, [(0, "t")], tapped, 4, (-8, 8))
        group = probe_stats.TAP_GROUPS[0]
        stream = probe_stats.group_rows(
            0, group, [(0, "s")], stream_statistics(x[None])[0].tolist()
        )
        per_head = probe_stats.head_rows(
            0, [0], probe_stats.head_statistics(*heads).flatten().tolist()
        )
        return {(r.component, r.stat, r.value) for r in taps + stream + per_head}

    expected = filed()
    assert len({value for _, _, value in expected}) == len(expected)
    assert ("t", "max_abs", 14.0) in expected and ("1", "attn_logit_max_abs", 10.0) in expected
    for name in ("TAP_STATS", "STREAM_STATS", "ATTENTION_HEAD_STATS"):
        monkeypatch.setattr(probe_stats, name, getattr(spec, name)[::-1])
    stream = dataclasses.replace(probe_stats.TAP_GROUPS[0], names=spec.STREAM_STATS[::-1])
    monkeypatch.setattr(probe_stats, "TAP_GROUPS", (stream, *probe_stats.TAP_GROUPS[1:]))
    assert filed() == expected
    monkeypatch.setattr(probe_stats, "TAP_STATS", spec.TAP_STATS[1:])
    with pytest.raises(ValueError, match="expected"):
        tap_statistics(x[None])


def test_attention_entropy_of_uniform_and_one_hot_rows():
    uniform = torch.full((1, 2, 4, 4), 0.25)  # (B, nh, T, T)
    one_hot = torch.eye(4).expand(1, 2, 4, 4)
    assert attention_entropy(uniform).tolist() == pytest.approx([math.log(4)] * 2)
    assert attention_entropy(one_hot).tolist() == pytest.approx([0.0, 0.0])


def direct_token_cos(x: torch.Tensor) -> float:
    """Mean cosine similarity over every window and every pair of different positions,
    pair by pair."""
    B, T, _ = x.shape
    values = [
        torch.nn.functional.cosine_similarity(x[b, i], x[b, j], dim=0).item()
        for b in range(B)
        for i in range(T)
        for j in range(T)
        if i != j
    ]
    return sum(values) / len(values)


def test_stream_statistics_match_a_pair_by_pair_computation():
    x = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(0)) + 0.5
    token_cos, max_over_median = stream_statistics(x[None])[0].tolist()
    assert token_cos == pytest.approx(direct_token_cos(x), abs=1e-6)
    magnitudes = sorted(abs(v) for v in x.reshape(-1).tolist())
    median = magnitudes[(len(magnitudes) - 1) // 2]  # torch's median: the lower middle
    assert max_over_median == pytest.approx(magnitudes[-1] / median, rel=1e-6)


def test_token_cos_is_one_for_identical_positions_and_near_zero_for_orthogonal_ones():
    same = torch.tensor([1.0, -2.0, 0.5]).expand(2, 4, 3)  # every position the same vector
    assert stream_statistics(same[None])[0, 0].item() == pytest.approx(1.0)
    orthogonal = torch.eye(4).expand(2, 4, 4)  # position i is the unit vector e_i
    assert stream_statistics(orthogonal[None])[0, 0].item() == pytest.approx(0.0, abs=1e-7)
    assert math.isnan(stream_statistics(torch.ones(1, 2, 1, 3))[0, 0].item())  # no pair at all


def test_dead_units_are_those_zero_at_every_position_of_every_window():
    hidden = torch.rand(2, 3, 8) + 0.1  # (B, T, d_ff): every unit alive
    hidden[:, :, [1, 5]] = 0.0  # two units never fire
    hidden[0, 0, 2] = hidden[1, :, 3] = 0.0  # zero somewhere, alive elsewhere: not dead
    assert ffn_unit_statistics(hidden[None]).item() == pytest.approx(2 / 8)


def test_output_statistics_are_the_largest_logit_and_the_mean_log_partition():
    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(1)) * 3
    largest, log_z = output_statistics(logits[None])[0].tolist()
    assert largest == pytest.approx(logits.abs().max().item())
    rows = logits.reshape(-1, 11).tolist()
    direct = sum(math.log(sum(math.exp(v) for v in row)) for row in rows) / len(rows)
    assert log_z == pytest.approx(direct, rel=1e-6)


@pytest.mark.parametrize(
    ("statistics", "shape"),
    [
        (tap_statistics, (2, 3, 5)),
        (stream_statistics, (2, 3, 5)),
        (ffn_unit_statistics, (2, 3, 8)),
        (output_statistics, (2, 5, 11)),
        (attention_entropy, (2, 3, 4, 4)),
    ],
)
def test_each_run_of_a_stack_gets_the_statistics_it_would_get_alone(statistics, shape):
    """A probe reduces every dimension but K: each row of a stack of three is that run's
    statistics as a stack of one, to the last bit (histograms included)."""
    generator = torch.Generator().manual_seed(2)
    runs = [torch.randn(shape, generator=generator) * scale for scale in (0.5, 3.0, 9.0)]
    runs[1][0, 0] = 0.0  # a zero and values beyond the histogram's range in some runs only
    if statistics is attention_entropy:
        runs = [run.softmax(dim=-1) for run in runs]
    together = statistics(torch.stack(runs))
    for index, run in enumerate(runs):
        assert torch.equal(together[index], statistics(run[None])[0]), index


def causal_logits(config: cfg.RunConfig, block: torch.nn.Module, x: torch.Tensor, head: int):
    """Every causal pre-softmax logit q_i·k_j/sqrt(hs) of one head, pair by pair, from the
    attention's input x (B, T, C) (Pre-LN without qk_norm: the block's norm1_out)."""
    head_dim = config.model.head_dim
    q, k, _ = block.attn.qkv(x).split(config.model.d_model, dim=-1)
    cols = slice(head * head_dim, (head + 1) * head_dim)
    return [
        (q[b, i, cols] @ k[b, j, cols]).item() / math.sqrt(head_dim)
        for b in range(x.size(0))
        for i in range(x.size(1))
        for j in range(i + 1)  # causal: a query sees itself and the keys before it
    ]


@pytest.mark.parametrize("flip_keys", [False, True])
def test_capture_attention_keeps_each_heads_largest_causal_logit_and_largest_magnitude(
    flip_keys,
):
    config = tiny_config()
    model = CharTransformer(config.model).eval()
    if flip_keys:
        # k = -q: each query's logit with itself is -|q|²/sqrt(hs), the largest in size, so
        # the largest |logit| is a negative one, far from the largest logit.
        d = config.model.d_model
        with torch.no_grad():
            for block in model.blocks:
                block.attn.qkv.weight[d : 2 * d] = -4 * block.attn.qkv.weight[:d]
                if block.attn.qkv.bias is not None:
                    block.attn.qkv.bias[d : 2 * d] = -4 * block.attn.qkv.bias[:d]
    x = torch.randint(config.model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2))
    with tap_hooks(model, taps=("norm1_out",)) as inputs, capture_attention(model) as maps:
        model(x)
    for layer, block in enumerate(model.blocks):
        for head in range(config.model.n_head):
            logits = causal_logits(config, block, inputs[(layer, "norm1_out")], head)
            largest = max(abs(value) for value in logits)
            assert maps.max_logits[layer][head].item() == pytest.approx(max(logits), rel=1e-5)
            assert maps.max_abs_logits[layer][head].item() == pytest.approx(largest, rel=1e-5)
            if flip_keys:
                assert largest == -min(logits) and largest > max(logits) + 1


def test_tap_hooks_can_hook_the_named_taps_only():
    model = CharTransformer(tiny_config().model)
    with tap_hooks(model, taps=("resid_post", "ffn_hidden")) as acts:
        model(torch.zeros(1, 4, dtype=torch.long))
    assert set(acts) == {(layer, tap) for layer in (0, 1) for tap in ("resid_post", "ffn_hidden")}


# ---------------------------------------------------------------------- a probed fit


class HookSpy(Callback):
    """Fails the fit if any tap carries a hook on an ordinary training step."""

    def __init__(self) -> None:
        self.steps_checked = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        assert not any(tap._forward_hooks for tap in all_taps(pl_module.model))
        self.steps_checked += 1


class ListSink:
    """A second sink: keeps every record it is given."""

    def __init__(self) -> None:
        self.records: list[ProbeRecords] = []
        self.flushes = 0

    def write(self, records: ProbeRecords) -> None:
        self.records.append(records)

    def flush(self) -> None:
        self.flushes += 1


def probed_fit(tmp_path, store: RunStore | None, **overrides):
    quiet_lightning()
    config = tiny_config(**overrides)
    dm, config = helpers.tiny_datamodule(config)
    run_id = store.create_run("probe-test", config.to_json(), status="running") if store else 0
    sinks = [StoreSink(store, run_id), ListSink()] if store is not None else []
    probe = BlockProbe([sinks], probe_interval=2, sample_interval=3, sample_chars=20)
    spy = HookSpy()
    lit = LitCharModel(config.to_dict(), dm.vocab.to_json())
    make_trainer(config, [probe, spy], run_dir=tmp_path).fit(lit, datamodule=dm)
    if store is not None:
        store.flush()
    return config, lit, probe, spy, run_id


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("probed")
    store = RunStore(tmp_path / "runs.db")
    config, lit, probe, spy, run_id = probed_fit(tmp_path, store)
    yield store, config, lit, probe, spy, run_id
    store.close()


def test_probe_steps_are_step_zero_every_interval_and_the_last(probed):
    store, _, _, probe, spy, run_id = probed
    # max_steps 6, interval 2: batch 5 is the last with a gradient, so it is probed too
    assert probe.probe_steps == [0, 2, 4, 5] == probe_steps(6, 2)  # core's schedule is the probe's
    assert spy.steps_checked == 6
    for kind in ("component", "param", "tap", "head"):
        assert store.layer_steps(run_id, kind) == [0, 2, 4, 5]
    grad_steps = store.scalars(run_id, names="train/grad_norm").step.tolist()
    assert grad_steps == [0, 2, 4, 5]


def test_a_last_step_on_the_interval_is_probed_once(tmp_path):
    with RunStore(tmp_path / "runs.db") as store:
        _, _, probe, _, run_id = probed_fit(tmp_path, store, max_steps=5)
        assert probe.probe_steps == [0, 2, 4]  # the last trained step, 4, is on the interval
        frame = store.layer_stats(run_id, kind="component", stat="grad_norm")
        assert not frame.duplicated(["step", "layer", "component"]).any()
        assert sorted(set(frame.step)) == [0, 2, 4]


def test_grad_norms_cover_every_layer_and_component(probed):
    store, config, *_, run_id = probed
    frame = store.layer_stats(run_id, kind="component", stat="grad_norm", step=0)
    found = set(zip(frame.layer, frame.component, strict=True))
    n = config.model.n_layer
    expected = {(-1, "embed"), (-1, "block"), (n, "norm"), (n, "head"), (n, "block")}
    expected |= {(i, c) for i in range(n) for c in ("attn", "ffn", "norm", "block")}
    # "weights": every layer with a matrix (the LM head's, untied here, at the head end).
    expected |= {(i, "weights") for i in range(-1, n + 1)}
    assert found == expected
    assert (frame.value > 0).all()


def test_group_norms_combine_their_tensors(probed):
    store, _, lit, *_, run_id = probed
    rows = store.layer_stats(run_id, step=2)
    params = rows[(rows.kind == "param") & (rows.stat == "grad_norm")]
    components = rows[(rows.kind == "component") & (rows.stat == "grad_norm")]
    names = {n for n, _ in lit.model.named_parameters()}
    assert set(params.component) == names
    attn0 = params[params.component.str.startswith("blocks.0.attn.")].value
    value = components.query("layer == 0 and component == 'attn'").value.item()
    assert value == pytest.approx(math.sqrt((attn0**2).sum()), rel=1e-5)
    block0 = components.query("layer == 0 and component not in ('block', 'weights')").value
    value = components.query("layer == 0 and component == 'block'").value.item()
    assert value == pytest.approx(math.sqrt((block0**2).sum()), rel=1e-5)
    global_norm = store.scalars(run_id, names="train/grad_norm").set_index("step").value[2]
    assert global_norm == pytest.approx(math.sqrt((params.value**2).sum()), rel=1e-5)


def test_the_weights_group_is_the_layers_matrices_alone(probed):
    store, _, lit, *_, run_id = probed
    rows = store.layer_stats(run_id, step=2)
    shapes = {name: p.ndim for name, p in lit.model.named_parameters()}
    tensors = rows[rows.kind == "param"]
    params = tensors.pivot(index="component", columns="stat", values="value")
    layer_of = tensors.groupby("component").layer.first()
    components = rows[rows.kind == "component"]
    for layer in (-1, 0, 1, 2):
        names = [n for n in params.index if shapes[n] == 2 and layer_of[n] == layer]
        assert names, layer
        mine = params.loc[names]
        weights = components[(components.layer == layer) & (components.component == "weights")]
        got = weights.set_index("stat").value
        assert got["grad_norm"] == pytest.approx(math.sqrt((mine.grad_norm**2).sum()), rel=1e-5)
        param_norm = math.sqrt((mine.param_norm**2).sum())
        assert got["param_norm"] == pytest.approx(param_norm, rel=1e-5)
        # ‖Δθ‖ of the group from the per-tensor ratios: ‖Δθ_i‖ = ratio_i · ‖θ_i‖
        delta = math.sqrt(((mine.update_ratio * mine.param_norm) ** 2).sum())
        assert got["update_ratio"] == pytest.approx(delta / param_norm, rel=1e-5)
    # A block's norm gains and biases are not in it: its parameter norm is below the block's.
    block0 = components[(components.layer == 0) & (components.stat == "param_norm")]
    norms = block0.set_index("component").value
    assert norms["weights"] < norms["block"]


def test_global_grad_norm_is_recorded_before_clipping(probed):
    store, config, *_, run_id = probed
    norms = store.scalars(run_id, names="train/grad_norm").value
    assert len(norms) == 4
    assert (norms > 10 * config.train.grad_clip).all()


def test_update_ratios_are_small_and_positive(probed):
    store, *_, run_id = probed
    ratios = store.layer_stats(run_id, kind="component", stat="update_ratio").value
    assert len(ratios) and (ratios > 0).all() and (ratios < 1).all()


def test_tap_statistics_and_histograms_for_every_tap(probed):
    store, config, _, probe, _, run_id = probed
    taps = block_tap_names(config.model)
    stats = store.layer_stats(run_id, kind="tap", step=4)
    # every tap's statistics, plus the stream's (resid_post) and the FFN units' (ffn_hidden)
    extras = [("resid_post", stat) for stat in STREAM_STATS] + [("ffn_hidden", "dead_frac")]
    assert set(zip(stats.layer, stats.component, stats.stat, strict=True)) == {
        (layer, tap, stat) for layer in range(2) for tap in taps for stat in TAP_STATS
    } | {(layer, tap, stat) for layer in range(2) for tap, stat in extras}
    hist = store.histograms(run_id, layer=1, tap="resid_post")
    assert sorted(hist.step.unique()) == [0, 2, 4, 5]
    assert hist.lo.min() == HIST_RANGE[0] and hist.hi.max() == HIST_RANGE[1]
    probe_values = probe.probe_batch * config.model.block_size * config.model.d_model
    # the bins hold the values inside the range, the two shares the rest
    taps = store.layer_stats(run_id, kind="tap", layer=1, component="resid_post")
    outside = taps[taps.stat.isin(["below_range", "above_range"])].groupby("step").value.sum()
    inside = hist.groupby("step")["count"].sum()
    assert ((inside + (outside * probe_values).round()) == probe_values).all()


def test_step_zero_records_the_new_statistics_of_the_initial_model(tmp_path):
    """Every statistic a probe added for the findings, against a direct computation on the
    probe batch with the model as it was before update 0."""
    quiet_lightning()
    config = tiny_config(max_steps=1, activation="relu")
    dm, config = helpers.tiny_datamodule(config)
    lit = LitCharModel(config.to_dict(), dm.vocab.to_json())
    initial = copy.deepcopy(lit.model).eval()
    sink = ListSink()
    probe = BlockProbe([[sink]], probe_interval=2, sample_interval=1000)
    make_trainer(config, [probe], run_dir=tmp_path).fit(lit, datamodule=dm)
    records = next(r for r in sink.records if r.step == 0)
    stats = {(row.layer, row.component, row.stat): row.value for row in records.layer_stats}
    x = probe._probe_x.cpu()
    with tap_hooks(initial) as acts, torch.no_grad():
        logits, _ = initial(x)
    assert records.scalars["probe/logit_max_abs"] == pytest.approx(logits.abs().max().item())
    log_z = torch.logsumexp(logits, dim=-1).mean().item()
    assert records.scalars["probe/log_z"] == pytest.approx(log_z, rel=1e-5)
    for layer in range(config.model.n_layer):
        stream = acts[(layer, "resid_post")]
        expected_cos = direct_token_cos(stream)
        assert stats[(layer, "resid_post", "token_cos")] == pytest.approx(expected_cos, abs=1e-5)
        ratio = (stream.abs().max() / stream.abs().median()).item()
        assert stats[(layer, "resid_post", "max_over_median")] == pytest.approx(ratio, rel=1e-5)
        hidden = acts[(layer, "ffn_hidden")].reshape(-1, config.model.d_ff)
        dead = sum(bool((hidden[:, unit] == 0).all()) for unit in range(config.model.d_ff))
        assert stats[(layer, "ffn_hidden", "dead_frac")] == pytest.approx(dead / config.model.d_ff)
        block = initial.blocks[layer]
        for head in range(config.model.n_head):
            logits = causal_logits(config, block, acts[(layer, "norm1_out")], head)
            recorded = stats[(layer, str(head), "attn_logit_max")]
            assert recorded == pytest.approx(max(logits), rel=1e-5)
            recorded_abs = stats[(layer, str(head), "attn_logit_max_abs")]
            assert recorded_abs == pytest.approx(max(abs(v) for v in logits), rel=1e-5)


def test_attention_entropy_per_head_is_bounded(probed):
    store, config, *_, run_id = probed
    heads = store.layer_stats(run_id, kind="head", stat="attn_entropy", step=0)
    assert len(heads) == config.model.n_layer * config.model.n_head
    assert ((heads.value >= 0) & (heads.value <= math.log(config.model.block_size))).all()


def test_attention_maps_and_samples_at_sample_steps_and_the_end(probed):
    store, *_, run_id = probed
    assert store.attention_steps(run_id) == [0, 3, 6]
    maps = store.attention(run_id, step=3)
    assert set(maps["layer"]) == {0, 1} and set(maps["head"]) == {0, 1}
    rows = maps.groupby(["layer", "head", "query"]).weight.sum()
    assert rows.to_numpy() == pytest.approx(1.0, abs=1e-3)
    assert (maps[maps["key"] > maps["query"]].weight == 0).all()  # causal
    samples = store.samples(run_id)
    assert sorted(samples.step) == [0, 3, 6]
    assert (samples.text.str.len() == 20).all()


def test_the_probe_says_which_step_its_latest_sample_is_of(probed):
    # (a batch's callbacks ask it before the end's sample, as the probe itself does)
    probe = probed[3]
    assert probe.sampled_at(6) and not probe.sampled_at(3) and not probe.sampled_at(5)


def test_every_sink_gets_the_records_the_store_got(probed):
    store, _, _, probe, _, run_id = probed
    listed = probe.run_sinks[0][1]
    # probe steps 0, 2, 4 and the last (5); sample steps 0, 3 and the end (6); one flush
    assert [records.step for records in listed.records] == [0, 2, 3, 4, 5, 6]
    assert listed.flushes == 1

    def comparable(value: float) -> float | None:
        return None if math.isnan(value) else value  # the update ratio of a zero tensor

    rows = {
        row[:5]: comparable(row.value) for records in listed.records for row in records.layer_stats
    }
    frame = store.layer_stats(run_id)
    keys = zip(frame.step, frame.layer, frame.kind, frame.component, frame.stat, strict=True)
    assert rows == {key: comparable(v) for key, v in zip(keys, frame.value, strict=True)}
    grad_norm = store.scalars(run_id, names="train/grad_norm").set_index("step").value
    assert {r.step: r.grad_norm for r in listed.records if r.grad_norm} == grad_norm.to_dict()
    for name in ("probe/logit_max_abs", "probe/log_z"):  # at the probe steps, as written
        stored = store.scalars(run_id, names=name).set_index("step").value.to_dict()
        assert stored == {r.step: r.scalars[name] for r in listed.records if r.scalars}
        assert sorted(stored) == [0, 2, 4, 5]


@pytest.mark.parametrize("variant", ["ffn-only", "attention-only"])
def test_probe_handles_blocks_without_a_sublayer(tmp_path, variant):
    with RunStore(tmp_path / "runs.db") as store:
        config, *_, run_id = probed_fit(tmp_path, store, max_steps=3, **VARIANTS[variant])
        taps = store.layer_stats(run_id, kind="tap", step=0)
        assert set(taps.component) == set(block_tap_names(config.model))
        has_attention = config.model.attention
        assert (store.attention_steps(run_id) != []) == has_attention
        assert store.layer_stats(run_id, kind="head").empty != has_attention


@pytest.mark.parametrize("attention", [True, False])
def test_a_probe_step_records_the_induction_rows_of_every_head_or_none(tmp_path, attention):
    with RunStore(tmp_path / "runs.db") as store:
        overrides = {"ffn": False} if attention else {"attention": False}
        config, *_, run_id = probed_fit(tmp_path, store, max_steps=3, **overrides)
        for stat in spec.INDUCTION_STATS:
            rows = store.layer_stats(run_id, kind="head", stat=stat)
            expected = config.model.n_layer * config.model.n_head if attention else 0
            assert len(rows[rows.step == 0]) == expected
            assert sorted(set(rows.step)) == ([0, 2] if attention else [])
        gain = store.scalars(run_id, names=spec.PROBE_REPEAT_GAIN)
        assert gain.step.tolist() == ([0, 2] if attention else [])


def test_probe_without_sinks_measures_nothing(tmp_path):
    _, _, probe, spy, _ = probed_fit(tmp_path, None, max_steps=3)
    assert probe.probe_steps == [] and spy.steps_checked == 3


class HostReads(TorchFunctionMode):
    """Counts the tensor methods that copy values to the host (a sync on an accelerator)."""

    READS = frozenset({"tolist", "item", "cpu", "numpy", "__float__", "__int__", "__bool__"})

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def test_a_probe_step_reaches_the_host_in_one_transfer(tmp_path, monkeypatch):
    reads: dict[int, list[str]] = {}

    def counted(method):
        def run(self, trainer, *args):
            with HostReads() as mode:  # the host side after the copy reads plain floats
                method(self, trainer, *args)
            reads.setdefault(trainer.global_step, []).extend(mode.reads)

        return run

    monkeypatch.setattr(
        BlockProbe, "on_before_optimizer_step", counted(BlockProbe.on_before_optimizer_step)
    )
    monkeypatch.setattr(BlockProbe, "on_train_batch_end", counted(BlockProbe.on_train_batch_end))
    quiet_lightning()
    config = tiny_config(max_steps=5)
    dm, config = helpers.tiny_datamodule(config)
    # sample steps (generation, attention maps) only at step 0: steps 2 and 4 probe alone
    probe = BlockProbe([[ListSink()]], probe_interval=2, sample_interval=1000)
    lit = LitCharModel(config.to_dict(), dm.vocab.to_json())
    make_trainer(config, [probe], run_dir=tmp_path).fit(lit, datamodule=dm)
    assert probe.probe_steps == [0, 2, 4]
    # on_train_batch_end runs after the optimizer step has advanced global_step
    probed = {step: reads.get(step, []) + reads.get(step + 1, []) for step in (2, 4)}
    assert probed == {2: ["tolist"], 4: ["tolist"]}
