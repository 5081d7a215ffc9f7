"""`blockviz init-grads`: the gradient at initialization, Pre-LN vs Post-LN (training side)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from blockviz import cli
from blockviz.core import config as cfg
from blockviz.core import init_grads as core_init_grads
from blockviz.core.config_model import ModelConfig
from blockviz.training import init_grads
from blockviz.training.data import CharDataModule
from blockviz.training.model import CharTransformer

# A small model on the built-in pydocs corpus: seconds on a CPU.
SMALL = cfg.replace(cfg.RunConfig(), d_model=32, n_head=2, block_size=32, batch_size=8)
SMALL_FLAGS = ["--d_model", "32", "--n_head", "2", "--block_size", "32", "--batch_size", "8"]


def test_xavier_post_over_pre_ratio_grows_with_depth() -> None:
    # Xiong et al. 2020 (Theorem 1) predict this for Xavier init. Measured on this small
    # config before writing the test (seeds 0, 1): about 1.5, 1.9, 2.7 at 2, 4, 8 layers.
    rows = init_grads.measure(SMALL, depths=[2, 4, 8], inits=["xavier"], seeds=[0, 1])
    ratios = [row["ratio"] for row in core_init_grads.summarise(rows)]
    assert len(ratios) == 3
    assert ratios[0] < ratios[1] < ratios[2], ratios


def test_the_numbers_equal_a_direct_computation() -> None:
    seed, depth = 1, 3
    rows = init_grads.measure(SMALL, depths=[depth], inits=["default", "gpt2"], seeds=[seed])
    datamodule = CharDataModule(SMALL.data, block_size=32, batch_size=8, seed=seed, eval_iters=1)
    datamodule.setup()
    x, y = next(iter(datamodule.train_dataloader()))  # (B, T), (B, T)
    for init in ("default", "gpt2"):
        for position in ("pre", "post"):
            model_cfg = ModelConfig(
                vocab_size=datamodule.vocab.size,
                n_layer=depth,
                n_head=2,
                d_model=32,
                block_size=32,
                norm_position=position,
                init=init,
            )
            torch.manual_seed(seed)
            model = CharTransformer(model_cfg)
            logits, _ = model(x)  # (B, T, vocab)
            F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).backward()
            expected = [b.ffn.fc_out.weight.grad.norm().item() for b in model.blocks]
            got = [
                r["grad_norm"]
                for r in sorted(rows, key=lambda r: r["layer"])
                if (r["init"], r["norm_position"]) == (init, position)
            ]
            assert got == pytest.approx(expected, rel=1e-6), (init, position)


def test_summary_is_the_ratio_of_seed_means_with_the_seed_range() -> None:
    rows = [
        {"init": "default", "norm_position": p, "depth": 2, "seed": s, "layer": 1, "grad_norm": v}
        for p, s, v in [("post", 0, 3.0), ("post", 1, 5.0), ("pre", 0, 1.0), ("pre", 1, 4.0)]
    ] + [  # first blocks do not enter the last-block summary
        {"init": "default", "norm_position": p, "depth": 2, "seed": 0, "layer": 0, "grad_norm": 9.0}
        for p in ("post", "pre")
    ]
    (row,) = core_init_grads.summarise(rows)
    assert row["post_last"] == 4.0 and row["pre_last"] == 2.5
    assert row["ratio"] == pytest.approx(4.0 / 2.5)
    assert (row["ratio_min"], row["ratio_max"]) == (pytest.approx(5 / 4), 3.0)


def test_cli_table_and_json_say_the_same(capsys) -> None:
    flags = ["init-grads", *SMALL_FLAGS, "--depths", "2", "3", "--inits", "xavier"]
    assert cli.main([*flags, "--seeds", "1", "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["quantity"] == "ffn.fc_out.weight"
    assert result["seeds"] == [0] and result["depths"] == [2, 3]
    assert len(result["rows"]) == 2 * (2 + 3)  # positions × blocks
    assert [r["depth"] for r in result["summary"]] == [2, 3]

    assert cli.main([*flags, "--seeds", "1"]) == 0
    captured = capsys.readouterr()
    assert "progress 4/4 done" in captured.err
    lines = captured.out.splitlines()
    assert "post/pre" in lines[1]
    for summary in result["summary"]:
        line = next(ln for ln in lines if ln.split()[:2] == ["xavier", str(summary["depth"])])
        assert f"{summary['ratio']:.2f}" in line.split()
    post_by_layer = [ln for ln in lines if ln.strip().startswith("post by layer")]
    assert len(post_by_layer) == 2 and len(post_by_layer[1].split(":")[1].split()) == 3


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--depths", "0"], "--depths 0"),
        (["--seeds", "0"], "--seeds 0"),
        (["--threads", "0"], "--threads 0"),
        (["--ffn", "false"], "ffn is off"),
        (["--n_head", "3"], "n_head"),
    ],
)
def test_cli_bad_options_are_one_line_and_status_2(flags, message, capsys) -> None:
    assert cli.main(["init-grads", "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blockviz init-grads: error:") and message in err
