"""LitCharModel: LR schedule, parameter groups, validation metrics, checkpoints, generation."""

import io
import math

import pytest
import torch

from blockviz.core import config as cfg
from blockviz.core.config_train import TrainConfig
from blockviz.core.corpora import Corpus
from blockviz.core.vocab import CharVocab
from blockviz.training.callbacks import ConsoleProgress
from blockviz.training.data import CharDataModule, answer_accuracy, baseline_predictions, batch_from
from blockviz.training.lit import LN2, LitCharModel, lr_at, param_groups
from blockviz.training.trainer import make_trainer, quiet_lightning, resolve_precision
from tests.helpers import tiny_config

torch.set_num_threads(1)

TEXT = ("one two three four five six seven eight nine ten.\n" * 60) + "1+2=3\n4+5=9\n" * 40


def datamodule_for(config: cfg.RunConfig, text: str = TEXT) -> CharDataModule:
    dm = CharDataModule(
        config.data,
        config.model.block_size,
        config.train.batch_size,
        eval_iters=config.train.eval_iters,
        corpus=Corpus("test", "test", text),
    )
    dm.setup()
    return dm


def lit_for(config: cfg.RunConfig, dm: CharDataModule) -> LitCharModel:
    config = cfg.replace(config, vocab_size=dm.vocab.size)
    return LitCharModel(config.to_dict(), dm.vocab.to_json())


# ------------------------------------------------------------------------ the schedule


SCHEDULE = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "max_steps": 110}


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [
        # warm-up is linear and reaches the peak at its last step, for every schedule
        ("cosine", 0, 1e-4),
        ("cosine", 4, 5e-4),
        ("linear", 9, 1e-3),
        ("constant", 0, 1e-4),
        # end of warm-up: the peak
        ("constant", 10, 1e-3),
        ("cosine", 10, 1e-3),
        ("linear", 10, 1e-3),
        # halfway through the decay: cosine and linear are both at the mean of the ends
        ("constant", 60, 1e-3),
        ("cosine", 60, 5.5e-4),
        ("linear", 60, 5.5e-4),
        # a quarter of the way: cosine is still above the straight line
        ("cosine", 35, 1e-4 + 0.9e-3 * (1 + math.cos(math.pi / 4)) / 2),
        ("linear", 35, 1e-3 - 0.25 * 0.9e-3),
        # the end and beyond: min_lr (constant stays at lr)
        ("constant", 110, 1e-3),
        ("cosine", 110, 1e-4),
        ("linear", 110, 1e-4),
        ("cosine", 500, 1e-4),
    ],
)
def test_lr_schedule_values(schedule, step, expected):
    train = TrainConfig(**SCHEDULE, lr_schedule=schedule)
    assert lr_at(step, train) == pytest.approx(expected, rel=1e-9)


def test_no_warmup_starts_at_the_peak():
    train = TrainConfig(lr=3e-3, warmup_steps=0, max_steps=100)
    assert lr_at(0, train) == pytest.approx(3e-3)


def test_scheduler_steps_every_optimizer_step():
    config = tiny_config(**SCHEDULE, lr_schedule="cosine", n_layer=1)
    lit = LitCharModel(config.to_dict())
    setup = lit.configure_optimizers()
    optimizer, scheduler = setup["optimizer"], setup["lr_scheduler"]
    seen = []
    for _ in range(12):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([lr_at(s, config.train) for s in range(12)])


# ------------------------------------------------------------------ parameter groups


@pytest.mark.parametrize("tie_weights", [False, True])
@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_decay_only_linear_weight_matrices(tie_weights, norm_type):
    config = tiny_config(tie_weights=tie_weights, norm_type=norm_type)
    lit = LitCharModel(config.to_dict())
    decay, no_decay = param_groups(lit.model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in lit.model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    matrices = {
        f"blocks.{i}.{m}.weight"
        for i in range(2)
        for m in ("attn.qkv", "attn.proj", "ffn.fc_in", "ffn.fc_out")
    }
    # a tied matrix is listed once, as tok_emb.weight, and is the head's Linear weight: decayed
    head = "tok_emb.weight" if tie_weights else "lm_head.weight"
    assert decayed == matrices | {head}
    assert kept == set(names.values()) - decayed  # biases, norms, embeddings; each tensor once
    assert len(decay["params"]) + len(no_decay["params"]) == len(names)


# ------------------------------------------------------------------------ the Trainer


def test_precision_auto_is_fp32_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_precision("auto", "auto") == "32-true"
    assert resolve_precision("bf16-mixed", "cpu") == "bf16-mixed"


def test_precision_auto_picks_bf16_on_a_bf16_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_precision("auto", "auto") == "bf16-mixed"
    assert resolve_precision("auto", "cpu") == "32-true"


def test_trainer_flags_follow_the_config(tmp_path):
    quiet_lightning()
    config = tiny_config(grad_clip=0.5, eval_interval=7, eval_iters=3, max_steps=21)
    trainer = make_trainer(config, run_dir=tmp_path)
    assert trainer.gradient_clip_val is None  # the module clips (lit.OneStep)
    assert trainer.max_steps == 21
    assert trainer.val_check_interval == 7 and trainer.check_val_every_n_epoch is None
    assert trainer.limit_val_batches == 3
    assert trainer.checkpoint_callback.dirpath == str(tmp_path / "checkpoints")


@pytest.mark.parametrize("grad_clip", [0.0, 0.01])
def test_the_update_sees_the_gradient_clipped_to_grad_clip(tmp_path, grad_clip):
    quiet_lightning()
    config = tiny_config(grad_clip=grad_clip, max_steps=3, eval_interval=10)
    dm = datamodule_for(config)
    lit = lit_for(config, dm)
    norms = []
    clip = lit.configure_gradient_clipping

    def clip_and_record(optimizer, *args, **kwargs):  # what the update then uses
        clip(optimizer, *args, **kwargs)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        norms.append(float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))))

    lit.configure_gradient_clipping = clip_and_record
    make_trainer(config, run_dir=tmp_path).fit(lit, datamodule=dm)
    assert len(norms) == 3
    if grad_clip:
        assert norms == pytest.approx([grad_clip] * 3, rel=1e-4)
    else:
        assert min(norms) > 0.05  # the tiny model's gradients, left alone


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One tiny fit on CPU: its trainer, model, checkpoint folder and console output."""
    quiet_lightning()
    run_dir = tmp_path_factory.mktemp("fit")
    config = tiny_config(max_steps=6, eval_interval=3)
    dm = datamodule_for(config)
    lit = lit_for(config, dm)
    console = io.StringIO()  # not a terminal: one line every 2 steps
    trainer = make_trainer(config, [ConsoleProgress(console, every_n_steps=2)], run_dir=run_dir)
    trainer.fit(lit, datamodule=dm)
    return trainer, lit, run_dir, console.getvalue()


def test_progress_lines_show_step_loss_rate_and_eta(fitted):
    lines = fitted[3].splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["step 2/6", "step 4/6", "step 6/6"]
    assert all("loss " in line and "tok/s" in line and "ETA " in line for line in lines)
    assert "val " in lines[-1]  # the evaluation at step 3 is shown from then on


def test_validation_metrics_are_consistent(fitted):
    _, lit, _, _ = fitted
    val = lit.last_vals[0]
    assert val["step"] == 6
    assert val["val/bpc"] == pytest.approx(val["val/loss"] / LN2)
    assert val["val/ppl"] == pytest.approx(math.exp(val["val/loss"]))
    assert "val/answer_acc" not in val  # only the ops dataset has answers
    assert "val/answer_baseline" not in val


def test_checkpoints_load_with_weights_only(fitted):
    _, lit, run_dir, _ = fitted
    last = run_dir / "checkpoints" / "last.ckpt"
    best = run_dir / "checkpoints" / "best.ckpt"
    assert last.exists() and best.exists()
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    assert isinstance(hparams["run_config"], dict) and isinstance(hparams["vocab_json"], str)
    restored = LitCharModel.load_from_checkpoint(last, map_location="cpu", weights_only=True)
    assert restored.config == lit.config
    for (name, p), q in zip(lit.state_dict().items(), restored.state_dict().values(), strict=True):
        assert torch.equal(p.cpu(), q), name


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
def test_compiled_model_shares_weights_and_checkpoint_keys():
    config = tiny_config(compile=True, n_layer=1)
    lit = LitCharModel(config.to_dict())
    plain = LitCharModel(tiny_config(n_layer=1).to_dict())
    # compile wraps the same module without registering it: identical state_dict keys
    assert list(lit.state_dict()) == list(plain.state_dict())
    assert not any("_orig_mod" in name for name in lit.state_dict())


def test_answer_accuracy_is_logged_for_ops(tmp_path):
    quiet_lightning()
    # Enough 16-character windows that some hold a whole question and answer.
    config = tiny_config(
        dataset="ops", ops_examples=400, max_steps=3, eval_interval=3, eval_iters=8
    )
    dm = CharDataModule(config.data, config.model.block_size, config.train.batch_size, eval_iters=8)
    dm.setup()
    lit = lit_for(config, dm)
    make_trainer(config, run_dir=tmp_path).fit(lit, datamodule=dm)
    assert 0.0 <= lit.last_vals[0]["val/answer_acc"] <= 1.0
    # The trivial baseline, scored on the same answers of the same batches, is logged beside it.
    right = scored = 0
    for starts in dm.val_starts:
        x, y = batch_from(dm.val_ids, starts, dm.block_size)
        correct, total = answer_accuracy(
            x, y, baseline_predictions(x, dm.vocab, dm.answer_table), dm.vocab
        )
        right, scored = right + correct, scored + total
    assert scored > 0 and lit.last_vals[0]["val/answer_baseline"] == pytest.approx(right / scored)


# ------------------------------------------------------------------------ z-loss


def batch_and_lit(z_loss: float) -> tuple[tuple[torch.Tensor, torch.Tensor], LitCharModel]:
    """One training batch and a fresh model (seed 0) with that z-loss coefficient."""
    config = tiny_config(z_loss=z_loss)
    dm = datamodule_for(config)
    torch.manual_seed(0)
    lit = lit_for(config, dm)
    return next(iter(dm.train_dataloader())), lit


def test_z_loss_adds_the_squared_log_normaliser_to_the_objective():
    coefficient = 0.05
    batch, lit = batch_and_lit(coefficient)
    loss, out = lit.objective(batch)
    x, y = batch
    logits, _ = lit.model(x)  # (B, T, V)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
    log_z = torch.log(logits.exp().sum(dim=-1))  # (B, T), written out
    torch.testing.assert_close(loss, ce + coefficient * (log_z**2).mean())
    torch.testing.assert_close(out["loss"], loss.detach())
    torch.testing.assert_close(out["ce"], ce)
    assert not out["ce"].requires_grad  # only the total is back-propagated
    assert loss - out["ce"] > 0.01  # log Z is far from 0 at init: the term counts
    # the total's gradient is not the cross-entropy's
    loss.backward()
    total_grad = lit.model.lm_head.weight.grad.clone()
    lit.model.zero_grad()
    ce.backward()
    assert not torch.allclose(total_grad, lit.model.lm_head.weight.grad)


def test_without_z_loss_the_step_is_the_bare_cross_entropy():
    batch, lit = batch_and_lit(0.0)
    loss, out = lit.objective(batch)
    assert set(out) == {"loss"}
    x, y = batch
    torch.testing.assert_close(loss, lit.model(x, y)[1])
    torch.testing.assert_close(out["loss"], loss.detach())


# ------------------------------------------------------------------------ generation


@pytest.fixture
def small_lit() -> LitCharModel:
    vocab = CharVocab.from_text("abc \n")
    config = tiny_config(vocab_size=vocab.size)
    return LitCharModel(config.to_dict(), vocab.to_json())


def test_generate_returns_new_text_in_the_vocabulary(small_lit):
    text = small_lit.generate("ab", max_new_tokens=40, temperature=1.0)
    assert len(text) == 40 and set(text) <= set("abc \n")
    assert small_lit.model.training  # mode restored


def test_generate_with_a_seed_is_reproducible_and_leaves_global_rng_alone(small_lit):
    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = small_lit.generate("a", 30, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    assert small_lit.generate("a", 30, seed=7) == first


@pytest.mark.parametrize("prompt", ["", "zzz", "a" * 100])
def test_generate_copes_with_empty_unknown_and_long_prompts(small_lit, prompt):
    assert len(small_lit.generate(prompt, 5, temperature=0)) == 5


# ------------------------------------------------------------------------ the evaluation set


def test_one_checkpoint_scores_the_same_under_any_training_seed(tmp_path):
    """Re-scored with the data of two training seeds, one checkpoint gets one val loss:
    the evaluation windows do not follow the seed (they did, and read 0.19 nats apart)."""
    quiet_lightning()
    config = tiny_config(max_steps=4, eval_interval=4, eval_iters=3, seed=1)
    dm = datamodule_for(config)
    lit = lit_for(config, dm)
    trainer = make_trainer(config, run_dir=tmp_path)
    trainer.fit(lit, datamodule=dm)
    checkpoint = tmp_path / "scored.ckpt"
    trainer.save_checkpoint(checkpoint)
    losses = []
    for seed in (1, 2):
        seeded = cfg.replace(config, seed=seed)
        rescored = LitCharModel.load_from_checkpoint(checkpoint, weights_only=True)
        other = make_trainer(seeded, run_dir=tmp_path / f"seed{seed}")
        other.validate(rescored, datamodule=datamodule_for(seeded), verbose=False)
        losses.append(rescored.last_vals[0]["val/loss"])
    assert losses[0] == losses[1]
    assert losses[0] == pytest.approx(lit.last_vals[0]["val/loss"], abs=1e-6)
