"""The batched step's arithmetic: the stacked model is K models, ReplicaAdamW is K AdamWs,
the schedule is each solo run's, clipping is per replica, a masked replica stays inert,
and the probes of a batch reach the host in one transfer.

These run the code a GPU runs (no path of the batch is chosen by the device); on a CPU
a replica equals its solo run to float32 rounding (docs/replicas.md)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state

from blockviz.core import config as cfg
from blockviz.training.lit import lr_at
from blockviz.training.model import CharTransformer
from blockviz.training.probe_stats import RunStack
from blockviz.training.replica_optim import FlatStack, ReplicaAdamW, ReplicaSchedule
from blockviz.training.replicas import LitReplicas
from tests.helpers import tiny_config, tiny_datamodule

HYPER = [  # (lr, betas, weight decay) of three replicas
    (1e-2, (0.9, 0.99), 0.1),
    (3e-3, (0.8, 0.95), 0.0),
    (5e-2, (0.95, 0.999), 0.3),
]


@pytest.mark.parametrize("chunk", [1 << 15, 4])  # the whole stack; pieces across params
def test_replica_adamw_equals_one_torch_adamw_per_replica(monkeypatch, chunk):
    from blockviz.training import replica_optim

    monkeypatch.setattr(replica_optim, "CPU_CHUNK", chunk)
    torch.manual_seed(0)
    k = len(HYPER)
    shapes = [(5,), (4, 3)]
    decays = [False, True]  # matrices decay, vectors do not (as lit.param_groups decides)
    stacked = [nn.Parameter(torch.randn(k, *s)) for s in shapes]
    solos = [[nn.Parameter(p.detach()[i].clone()) for p in stacked] for i in range(k)]
    torch_opts = [
        torch.optim.AdamW(
            [
                {"params": [ps[1]], "weight_decay": wd},
                {"params": [ps[0]], "weight_decay": 0.0},
            ],
            lr=lr,
            betas=betas,
        )
        for ps, (lr, betas, wd) in zip(solos, HYPER, strict=True)
    ]
    flat = FlatStack.flatten(stacked, decays)
    ours = ReplicaAdamW(
        stacked,
        flat,
        [h[2] for h in HYPER],
        [h[1] for h in HYPER],
        lambda update: torch.tensor([h[0] for h in HYPER], dtype=torch.float64),
        lambda: torch.ones(k, dtype=torch.bool),
    )
    for _ in range(5):
        grads = [torch.randn(k, *s) for s in shapes]
        ours.zero_grad()
        for p, g in zip(stacked, grads, strict=True):
            p.grad.add_(g)  # the gradient lands in the flat buffer, as autograd puts it
        ours.step()
        for i, opt in enumerate(torch_opts):
            for p, g in zip(solos[i], grads, strict=True):
                p.grad = g[i].clone()
            opt.step()
    for i in range(k):
        for p, solo in zip(stacked, solos[i], strict=True):
            torch.testing.assert_close(p.detach()[i], solo.detach(), rtol=1e-6, atol=1e-7)
    assert ours.state_dict()["updates"] == 5
    # Every parameter and gradient lives in the two flat buffers.
    assert all(p.data_ptr() >= flat.data.data_ptr() for p in stacked)
    assert stacked[1].grad.data_ptr() == flat.grad[:, : flat.n_decay].data_ptr()


def test_replica_adamw_state_round_trips_through_a_checkpoint():
    lit, dm = _lit()
    optimizer = lit.configure_optimizers()
    x, y = next(iter(dm.train_dataloader()))
    batch = (torch.stack([x] * 3), torch.stack([y] * 3))
    for _ in range(2):
        optimizer.zero_grad()
        lit.objective(batch)[0].backward()
        optimizer.step()
    saved = optimizer.state_dict()
    again, _ = _lit()
    fresh = again.configure_optimizers()
    fresh.load_state_dict(saved)
    assert fresh.updates == 2
    assert torch.equal(fresh.exp_avg, optimizer.exp_avg)
    assert torch.equal(fresh.exp_avg_sq, optimizer.exp_avg_sq)
    first = again.stacked_params()[0]
    assert torch.equal(fresh.state[first]["exp_avg"], fresh.flat.view(fresh.exp_avg, first))


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
def test_the_device_schedule_is_each_solo_runs_lr_at(schedule):
    trains = [
        cfg.replace(cfg.RunConfig(), lr=lr, min_lr=lr / 10, warmup_steps=w, max_steps=40).train
        for lr, w in ((1e-2, 0), (3e-3, 5), (5e-2, 40))
    ]
    trains = [cfg.replace(cfg.RunConfig(train=t), lr_schedule=schedule).train for t in trains]
    ours = ReplicaSchedule(trains, 40, torch.device("cpu"))
    for update in (0, 1, 4, 5, 6, 20, 39, 40, 55):
        expected = [lr_at(update, t, 40) for t in trains]
        got = ours(update).tolist()
        assert got == pytest.approx(expected, rel=1e-12), update


def test_the_stacked_model_is_k_models():
    config = tiny_config(qk_norm=True, tie_weights=True, z_loss=1e-3).model
    config = cfg.replace(cfg.RunConfig(model=config), vocab_size=17).model
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(CharTransformer(config))
    params, _ = stack_module_state(models)
    template = CharTransformer(config).to("meta")
    aliases = dict(params)
    aliases["lm_head.weight"] = params["tok_emb.weight"]  # tied: one tensor, two names
    x = torch.randint(0, 17, (3, 2, 8))
    y = torch.randint(0, 17, (3, 2, 8))
    logits, losses = functional_call(template, aliases, (x, y))
    assert logits.shape == (3, 2, 8, 17) and losses.shape == (3,)
    for i, model in enumerate(models):
        solo_logits, solo_loss = model(x[i], y[i])
        torch.testing.assert_close(logits[i], solo_logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(losses[i], solo_loss, rtol=1e-5, atol=1e-6)


def _lit(k: int = 3, **overrides) -> tuple[LitReplicas, object]:
    dm, config = tiny_datamodule(tiny_config(**overrides))
    configs = [config.to_dict() for _ in range(k)]
    for i, c in enumerate(configs):
        c["train"]["seed"] = i
        c["train"]["grad_clip"] = [0.5, 0.0, 1e-3][i]
    return LitReplicas(configs, dm.vocab.to_json()), dm


def test_each_replica_is_clipped_by_its_own_norm_as_clip_grad_norm_does():
    lit, _ = _lit()
    lit.configure_optimizers()
    torch.manual_seed(1)
    params = lit.stacked_params()
    for p in params:
        p.grad.copy_(torch.randn_like(p))
    before = [p.grad.clone() for p in params]
    lit.configure_gradient_clipping(None)
    for i, limit in enumerate([0.5, 0.0, 1e-3]):
        solo = [nn.Parameter(torch.zeros_like(g[i])) for g in before]
        for p, g in zip(solo, before, strict=True):
            p.grad = g[i].clone()
        if limit:
            torch.nn.utils.clip_grad_norm_(solo, limit)  # what a solo run's Trainer calls
        for p, e in zip(params, [s.grad for s in solo], strict=True):
            torch.testing.assert_close(p.grad[i], e, rtol=1e-5, atol=1e-9)


def _solo_of(lit: LitReplicas, index: int):
    """Replica `index` as a LitCharModel of its own: its slice of the stack copied out."""
    from blockviz.training.lit import LitCharModel

    solo = LitCharModel(lit.configs[index].to_dict(), lit.hparams.vocab_json)
    with torch.no_grad():
        for name, stacked in zip(lit.names, lit.stacked_params(), strict=True):
            solo.model.get_parameter(name).copy_(stacked[index])
    return solo


def test_replicas_start_from_their_solo_weights_and_the_probe_reads_the_stack():
    from blockviz.training.lit import LitCharModel

    lit, dm = _lit()
    lit.configure_optimizers()  # the stack laid flat first: the probe's stack follows it
    stack = lit.stack()
    for i in range(lit.k):
        torch.manual_seed(i)
        solo = LitCharModel(lit.configs[i].to_dict(), dm.vocab.to_json())
        assert stack.names == [name for name, _ in solo.model.named_parameters()]
        for name, ours, theirs in zip(
            stack.names, stack.params, solo.model.parameters(), strict=True
        ):
            assert torch.equal(ours[i], theirs), name
    # what the probe reads is the stack itself (no copy), its gradients the flat buffer's
    with torch.no_grad():
        lit.flat.data[1].add_(1.0)
        lit.flat.grad[2].fill_(3.0)
    assert torch.equal(stack.params[0][1], lit.stacked_params()[0][1])
    assert (lit.stack().grads[0][2] == 3.0).all()
    # the stack is the one copy of the weights: the template that runs it holds none
    assert all(p.is_meta for p in lit.template.wrapper.parameters())
    assert sum(p.numel() for p in lit.parameters()) == lit.k * lit.n_params()


def test_a_masked_replica_is_inert_and_the_others_are_untouched():
    lit, dm = _lit()
    x, y = next(iter(dm.train_dataloader()))
    batch = (torch.stack([x] * 3), torch.stack([y] * 3))
    optimizer = lit.configure_optimizers()
    with torch.no_grad():
        lit.stacked_params()[0][1].fill_(float("nan"))  # replica 1 blew up
    lit.mark_diverged(1, step=0)
    assert lit.alive.tolist() == lit.live == [True, False, True]  # the checkpoint's and the host's
    assert lit.diverged_at.tolist()[1] == 0
    loss, out = lit.objective(batch)
    assert torch.isfinite(out["loss"]) and torch.isfinite(out["ce"]).all()
    loss.backward()
    kept = [p.detach()[[0, 2]].clone() for p in lit.stacked_params()]
    optimizer.step()
    for p, old in zip(lit.stacked_params(), kept, strict=True):
        assert torch.count_nonzero(p.detach()[1]) == 0
        assert not torch.equal(p.detach()[[0, 2]], old)  # the live ones trained
    assert torch.count_nonzero(optimizer.exp_avg[1]) == 0


def test_a_replica_that_blows_up_does_not_reach_the_others():
    lit, dm = _lit()
    x, y = next(iter(dm.train_dataloader()))
    batch = (torch.stack([x] * 3), torch.stack([y] * 3))
    optimizer = lit.configure_optimizers()
    with torch.no_grad():
        lit.stacked_params()[0][1].fill_(float("nan"))  # not masked yet (found at the next log)
    optimizer.zero_grad()
    lit.objective(batch)[0].backward()
    lit.configure_gradient_clipping(optimizer)
    optimizer.step()
    assert torch.isfinite(lit.flat.data[[0, 2]]).all()
    assert not torch.isfinite(lit.flat.data[1]).all()


def test_the_objective_is_the_sum_of_each_replicas_own():
    lit, dm = _lit(z_loss=1e-2)
    x, y = next(iter(dm.train_dataloader()))
    batch = (torch.stack([x] * 3), torch.stack([y] * 3))
    loss, _ = lit.objective(batch)
    logits, ce = lit.score(*batch)
    log_z = logits.float().logsumexp(dim=-1)
    expected = sum(ce[i] + 1e-2 * log_z[i].pow(2).mean() for i in range(3))
    assert math.isclose(float(loss.detach()), float(expected.detach()), rel_tol=1e-5)


@pytest.mark.slow
def test_a_batchs_probe_steps_reach_the_host_in_one_transfer(tmp_path, monkeypatch):
    from blockviz.core.plans import Member, Plan
    from blockviz.core.requests import Session
    from blockviz.training import probes
    from blockviz.training.train import train
    from tests.fakes import CORPUS

    corpus = tmp_path / "fox.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    base = cfg.replace(
        cfg.preset("tiny"),
        dataset=str(corpus),
        accelerator="cpu",
        max_steps=6,
        probe_interval=2,
        sample_interval=100,
        eval_interval=3,
        warmup_steps=1,
    )
    sizes: list[int] = []
    real = probes.to_host

    def counted(pending, k):
        sizes.append(k)
        return real(pending, k)

    monkeypatch.setattr(probes, "to_host", counted)
    forwards: list[int] = []
    real_call = RunStack.__call__
    monkeypatch.setattr(
        RunStack, "__call__", lambda self, idx: (forwards.append(1), real_call(self, idx))[1]
    )
    configs = [cfg.replace(base, seed=s) for s in (0, 1, 2)]
    plan = Plan(tuple(Member(c, n) for c, n in zip(configs, "abc", strict=True)))
    assert train(plan, Session(str(tmp_path / "s.db")), create=True).exit_code == 0
    # Probe steps 0, 2, 4 and the last (5), then the end's sample: one transfer each for
    # all three replicas, and at each probe step two stacked forward passes for all three
    # (the probe batch, the induction batch), one at the end; none on the steps 1 and 3.
    assert sizes == [3, 3, 3, 3, 3]
    assert len(forwards) == 4 * 2 + 1


@pytest.mark.slow
def test_a_compiled_batch_steps_as_the_eager_one_without_recompiling(monkeypatch):
    import functools

    import torch._dynamo

    # aot_eager: Dynamo's graph capture and AOTAutograd without code generation, so the
    # test checks what `compile true` traces in seconds (inductor takes a minute here).
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    runs = []
    for compiled in (False, True):
        lit, dm = _lit(compile=compiled)
        optimizer = lit.configure_optimizers()
        x, y = next(iter(dm.train_dataloader()))
        batch = (torch.stack([x] * 3), torch.stack([y] * 3))
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss, out = lit.objective(batch)
            loss.backward()
            lit.configure_gradient_clipping(optimizer)
            optimizer.step()
            losses.append(out["ce"])
        runs.append(torch.stack(losses))
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-5, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # one graph, every step


def test_a_batch_samples_every_replica_in_one_pass_as_its_own_model_would():
    lit, _ = _lit()
    lit.configure_optimizers()
    texts = lit.generate_all("the ", max_new_tokens=12, temperature=0.0, seed=3)
    for index, text in enumerate(texts):  # greedy: each replica's own argmax
        solo = _solo_of(lit, index)
        assert text == solo.generate("the ", max_new_tokens=12, temperature=0.0)
    with torch.no_grad():
        lit.flat.data[1].fill_(float("nan"))
    texts = lit.generate_all("the ", max_new_tokens=5, temperature=1.0, seed=3)
    assert texts[1] is None and all(isinstance(texts[i], str) for i in (0, 2))
