"""The batched step's arithmetic: ReplicaAdamW is K AdamWs, clipping is per replica, a
masked replica stays inert, and the probes of a batch reach the host in one transfer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from blockviz.training.replicas import LitReplicas, ReplicaAdamW
from tests.helpers import tiny_config, tiny_datamodule

HYPER = [  # (lr, betas, weight decay) of three replicas
    (1e-2, (0.9, 0.99), 0.1),
    (3e-3, (0.8, 0.95), 0.0),
    (5e-2, (0.95, 0.999), 0.3),
]


def test_replica_adamw_equals_one_torch_adamw_per_replica():
    torch.manual_seed(0)
    k = len(HYPER)
    shapes = [(4, 3), (5,)]
    decays = [True, False]  # matrices decay, vectors do not (as lit.param_groups decides)
    stacked = [nn.Parameter(torch.randn(k, *s)) for s in shapes]
    solos = [[nn.Parameter(p.detach()[i].clone()) for p in stacked] for i in range(k)]
    torch_opts = [
        torch.optim.AdamW(
            [
                {"params": [ps[0]], "weight_decay": wd},
                {"params": [ps[1]], "weight_decay": 0.0},
            ],
            lr=lr,
            betas=betas,
        )
        for ps, (lr, betas, wd) in zip(solos, HYPER, strict=True)
    ]
    ours = ReplicaAdamW(
        stacked,
        decays,
        [h[2] for h in HYPER],
        [h[1] for h in HYPER],
        lambda update: [h[0] for h in HYPER],
        lambda: [True] * k,
    )
    for _ in range(5):
        grads = [torch.randn(k, *s) for s in shapes]
        for p, g in zip(stacked, grads, strict=True):
            p.grad = g.clone()
        ours.step()
        for i, opt in enumerate(torch_opts):
            for p, g in zip(solos[i], grads, strict=True):
                p.grad = g[i].clone()
            opt.step()
    for i in range(k):
        for p, solo in zip(stacked, solos[i], strict=True):
            assert torch.equal(p.detach()[i], solo.detach())  # torch's arithmetic, bit for bit
    assert ours.state_dict()["updates"] == 5


def _lit(k: int = 3, **overrides) -> tuple[LitReplicas, object]:
    dm, config = tiny_datamodule(tiny_config(**overrides))
    configs = [config.to_dict() for _ in range(k)]
    for i, c in enumerate(configs):
        c["train"]["seed"] = i
        c["train"]["grad_clip"] = [0.5, 0.0, 1e-3][i]
    return LitReplicas(configs, dm.vocab.to_json()), dm


def test_each_replica_is_clipped_by_its_own_norm_as_clip_grad_norm_does():
    lit, _ = _lit()
    torch.manual_seed(1)
    params = lit.stacked_params()
    for p in params:
        p.grad = torch.randn_like(p)
    before = [p.grad.clone() for p in params]
    lit.configure_gradient_clipping(None)
    for i, limit in enumerate([0.5, 0.0, 1e-3]):
        solo = [nn.Parameter(torch.zeros_like(g[i])) for g in before]
        for p, g in zip(solo, before, strict=True):
            p.grad = g[i].clone()
        if limit:
            torch.nn.utils.clip_grad_norm_(solo, limit)  # what a solo run's Trainer calls
        for p, e in zip(params, [s.grad for s in solo], strict=True):
            assert torch.equal(p.grad[i], e)


def test_replicas_start_from_their_solo_weights_and_views_share_storage():
    from blockviz.training.lit import LitCharModel

    lit, dm = _lit()
    views = lit.make_views()
    for i, view in enumerate(views):
        torch.manual_seed(i)
        solo = LitCharModel(lit.configs[i].to_dict(), dm.vocab.to_json())
        for (name, ours), theirs in zip(
            view.model.named_parameters(), solo.model.parameters(), strict=True
        ):
            assert torch.equal(ours, theirs), name
    first = lit.stacked_params()[0]
    with torch.no_grad():
        first[1].add_(1.0)
    assert torch.equal(next(views[1].model.parameters()), first[1])


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
    out = lit.training_step(batch, 0)
    assert torch.isfinite(out["loss"]) and torch.isfinite(out["ce"]).all()
    out["loss"].backward()
    kept = [p.detach()[[0, 2]].clone() for p in lit.stacked_params()]
    optimizer.step()
    for p, old in zip(lit.stacked_params(), kept, strict=True):
        assert torch.count_nonzero(p.detach()[1]) == 0
        assert not torch.equal(p.detach()[[0, 2]], old)  # the live ones trained


@pytest.mark.slow
def test_a_batchs_probe_steps_reach_the_host_in_one_transfer(tmp_path, monkeypatch):
    from blockviz.core import config as cfg
    from blockviz.core.requests import Session
    from blockviz.training import replica_fit
    from blockviz.training.plan import Member, Plan
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
    real = replica_fit.to_host

    def counted(pendings):
        sizes.append(len(pendings))
        return real(pendings)

    monkeypatch.setattr(replica_fit, "to_host", counted)
    configs = [cfg.replace(base, seed=s) for s in (0, 1, 2)]
    plan = Plan(tuple(Member(c, n) for c, n in zip(configs, "abc", strict=True)))
    assert train(plan, Session(str(tmp_path / "s.db")), create=True).exit_code == 0
    # Probe steps 0, 2, 4 and the last (5): one transfer each for all three replicas.
    assert [s for s in sizes if s] == [3, 3, 3, 3]
