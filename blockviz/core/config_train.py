"""The training and data fields (`TrainConfig`, `DataConfig`), one `knob` each.

Optimisation, schedule, hardware, cadence, and the text a run trains on; declared here
once, with everything blockviz says about each (`core.fields`); `core.config` collects
them into the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from blockviz.core.bounds import MAX_SEED, MAX_STEPS, Bound
from blockviz.core.fields import (
    ADVANCED,
    DATA,
    FORK_FIXED,
    FORK_OFFERED,
    OPS,
    TRAINING,
    ConfigError,
    check_fields,
    knob,
    number_in,
)

LR_SCHEDULES = ("constant", "cosine", "linear")
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed")
ACCELERATORS = ("auto", "cpu", "gpu", "mps")
STRATEGIES = ("auto", "ddp")
LOGGERS = ("none", "tensorboard", "csv")  # Lightning loggers a run writes besides the store

WEIGHT_DECAY_HELP = (
    "AdamW decay on the Linear weight matrices only: attention qkv and output, FFN in and "
    "out, the LM head (with tie_weights the token embedding is the LM head's matrix, so it "
    "decays too); none on biases, norm gains (qk_norm's included) or the untied token and "
    "position embeddings."
)


def _interval(default: int, label: str, help: str, step: int, code: str | None = None) -> Any:
    """A cadence in steps: a resume may change it."""
    bound = Bound(1, MAX_STEPS)
    return knob(
        default, label, help, bound=bound, group=ADVANCED, step=step, resume=True, code=code
    )


@dataclass
class TrainConfig:
    """Optimisation, schedule, hardware and logging cadence of a run."""

    SECTION: ClassVar[str] = "train"

    batch_size: int = knob(
        12,
        "Batch size",
        "Sequences per optimiser step (per device).",
        bound=Bound(1, 65_536),
        group=TRAINING,
        step=1,
        code="",
    )
    max_steps: int = knob(
        2000,
        "Steps (max_steps)",
        "Optimiser steps in the run.",
        bound=Bound(1, MAX_STEPS),
        group=TRAINING,
        step=100,
        token=lambda v: f"{v}steps",
        fork=FORK_OFFERED,
        resume=True,
        code="--max_steps's default",
    )
    lr: float = knob(
        1e-3,
        "Learning rate",
        "Peak learning rate (AdamW), reached after warm-up.",
        bound=Bound(0.0, 10.0, low_open=True),
        group=TRAINING,
        step=1e-4,
        fmt="%.1e",
        token=lambda v: f"lr{v:g}",
        fork=FORK_OFFERED,
        per_replica=True,
        code="peak learning rate; --lr's default",
    )
    min_lr: float = knob(
        1e-4,
        "Minimum LR",
        "Floor of the cosine / linear decay; at most lr.",
        bound=Bound(0.0, 10.0),
        group=TRAINING,
        step=1e-5,
        fmt="%.1e",
        per_replica=True,
        code="where the cosine / linear decay ends",
    )
    warmup_steps: int = knob(
        100,
        "Warm-up steps",
        "Linear warm-up from 0 to lr; at most max_steps. Xiong et al. 2020 report that Post-LN "
        "needs it at a high lr; here the Post-LN starter run without it stalls at lr 0.01 "
        "(README, Three runs to start with).",
        bound=Bound(0, MAX_STEPS),
        group=TRAINING,
        step=10,
        fork=FORK_OFFERED,
        per_replica=True,
        code="linear warm-up",
    )
    lr_schedule: str = knob(
        "cosine",
        "LR schedule",
        "Shape of the decay from lr to min_lr after warm-up.",
        choices=LR_SCHEDULES,
        group=TRAINING,
        per_replica=True,
        code="constant | cosine | linear",
    )
    weight_decay: float = knob(
        0.1,
        "Weight decay",
        WEIGHT_DECAY_HELP,
        bound=Bound(0.0, 10.0),
        group=ADVANCED,
        step=0.01,
        fmt="%.3f",
        fork=FORK_OFFERED,
        per_replica=True,
        code="Linear weights, a tied embedding too; no bias, norm or untied embedding",
    )
    beta1: float = knob(
        0.9,
        "Adam beta1",
        "AdamW first-moment decay.",
        bound=Bound(0.0, 1.0, high_open=True),
        group=ADVANCED,
        step=0.001,
        fmt="%.3f",
        per_replica=True,
        code="AdamW",
    )
    beta2: float = knob(
        0.99,
        "Adam beta2",
        "AdamW second-moment decay; a shorter memory suits small batches of characters.",
        bound=Bound(0.0, 1.0, high_open=True),
        group=ADVANCED,
        step=0.001,
        fmt="%.3f",
        per_replica=True,
        code="AdamW",
    )
    grad_clip: float = knob(
        1.0,
        "Gradient clip",
        "Clip the global gradient norm to this value; 0 disables clipping.",
        bound=Bound(0.0, 1e6),
        group=ADVANCED,
        step=0.1,
        fmt="%.2f",
        fork=FORK_OFFERED,
        per_replica=True,
        code="max global gradient norm; 0: no clipping",
    )
    z_loss: float = knob(
        0.0,
        "z-loss",
        "PaLM's z-loss (Chowdhery et al. 2022, \"PaLM: Scaling Language Modeling with "
        'Pathways", coefficient 1e-4): the objective becomes cross-entropy + z_loss·mean '
        "over positions of (log Z)², log Z the logsumexp of the logits, which pulls the "
        "softmax's normaliser towards 1. The logged train loss stays the cross-entropy alone, "
        "so runs with and without it compare on one scale. 0: off.",
        bound=Bound(0.0, 1.0),
        group=ADVANCED,
        step=1e-4,
        fmt="%.1e",
        token=lambda v: f"zloss{v:g}" if v else "no-zloss",
        fork=FORK_OFFERED,
        per_replica=True,
        code="trains on loss + Z_LOSS * mean(logsumexp(logits)^2); 0: off",
    )
    precision: str = knob(
        "auto",
        "Precision",
        "Lightning precision; auto picks bf16-mixed on a CUDA GPU that supports it, else 32-true.",
        choices=PRECISIONS,
        group=TRAINING,
        resume=True,
        code="auto | 32-true | bf16-mixed | 16-mixed",
    )
    accelerator: str = knob(
        "auto",
        "Accelerator",
        "Lightning accelerator; auto picks a GPU if one is visible.",
        choices=ACCELERATORS,
        group=TRAINING,
        resume=True,
        code="auto | cpu | gpu | mps; --device's default",
    )
    devices: int = knob(
        1,
        "Devices",
        "Devices per node.",
        bound=Bound(1, 1_024),
        group=ADVANCED,
        step=1,
        resume=True,
    )
    num_nodes: int = knob(
        1,
        "Nodes",
        "Nodes for multi-node training.",
        bound=Bound(1, 1_024),
        group=ADVANCED,
        step=1,
        resume=True,
    )
    strategy: str = knob(
        "auto",
        "Strategy",
        "ddp for several GPUs; Lightning does the distribution.",
        choices=STRATEGIES,
        group=ADVANCED,
        resume=True,
    )
    seed: int = knob(
        1337,
        "Seed",
        "Seed for initialisation and batch sampling.",
        bound=Bound(0, MAX_SEED),
        group=ADVANCED,
        step=1,
        per_replica=True,
        code="--seed's default",
    )
    log_interval: int = _interval(
        1,
        "Log every (steps)",
        "Steps between train-loss / learning-rate / throughput records.",
        1,
        "steps between printed train losses (their mean)",
    )
    eval_interval: int = _interval(
        100,
        "Evaluate every (steps)",
        "Steps between validation evaluations.",
        10,
        "steps between validation losses",
    )
    eval_iters: int = knob(
        20,
        "Validation batches",
        "Validation batches per evaluation; their windows come from the fixed evaluation "
        "seed, the same for every training seed.",
        bound=Bound(1, 100_000),
        group=ADVANCED,
        step=1,
        code="validation batches per evaluation",
    )
    probe_interval: int = _interval(
        50,
        "Probe every (steps)",
        "Steps between gradient / activation / update probes (step 0 and the last trained "
        "step are always probed).",
        10,
    )
    sample_interval: int = _interval(
        500, "Sample every (steps)", "Steps between generated text samples and attention maps.", 10
    )
    compile: bool = knob(
        False,
        "torch.compile",
        "torch.compile the model: worth it on a GPU, rarely on a laptop CPU. On a single GPU "
        "the compiled step replays as CUDA graphs.",
        group=ADVANCED,
        resume=True,
        code="torch.compile the model",
    )
    logger: str = knob(
        "none",
        "Also log to",
        "tensorboard or csv: the run also writes what it logs through Lightning's "
        "TensorBoardLogger / CSVLogger into its run folder; none: the run store only.",
        choices=LOGGERS,
        group=ADVANCED,
        resume=True,
    )
    ckpt_interval: int = knob(
        100,
        "Checkpoint every (steps)",
        "Steps between kept checkpoints, the steps a fork or a replay can start from; 0 keeps "
        "none.",
        bound=Bound(0, MAX_STEPS),
        group=ADVANCED,
        step=50,
        resume=True,
    )
    ckpt_keep: int = knob(
        8,
        "Checkpoints kept",
        "The most kept checkpoints on disk: one more doubles the spacing and drops the "
        "checkpoints off it, the first one excepted.",
        bound=Bound(2, 64),
        group=ADVANCED,
        step=1,
        resume=True,
    )

    def validate(self) -> TrainConfig:
        """Raise ConfigError on the first bad field; return self when all are fine."""
        check_fields(self)
        number_in("min_lr", self.min_lr, 0.0, self.lr)
        return self


def _ops(default: int, label: str, help: str, bound: Bound, step: int) -> Any:
    """A field of the synthetic ops task: what the checkpoint was trained on."""
    return knob(default, label, help, bound=bound, group=OPS, step=step, fork=FORK_FIXED)


@dataclass
class DataConfig:
    """Which characters a run trains on and how they are split."""

    SECTION: ClassVar[str] = "data"

    dataset: str = knob(
        "pydocs",
        "Dataset",
        "The text to train on: a built-in corpus (pydocs, pycode, shakespeare, ops) or the "
        "path of a UTF-8 text file.",
        token=lambda v: Path(v).stem,  # a built-in corpus's name is its own stem
        fork=FORK_FIXED,
        allowed_text="a built-in corpus (pydocs, pycode, shakespeare, ops) or a UTF-8 text "
        "file path",
    )
    val_fraction: float = knob(
        0.1,
        "Validation fraction",
        "The last fraction of the text is the validation split, never trained on.",
        bound=Bound(0.0, 0.5, low_open=True),
        group=DATA,
        step=0.01,
        fmt="%.2f",
        fork=FORK_FIXED,
        code="the last VAL_FRACTION of the text is validation",
    )
    ops_examples: int = _ops(
        20000,
        "ops: lines",
        "Lines generated for the synthetic ops task.",
        Bound(10, 1_000_000),
        1000,
    )
    ops_min_args: int = _ops(
        2, "ops: min arguments", "Fewest arguments per ops line.", Bound(1, 9), 1
    )
    ops_max_args: int = _ops(
        5,
        "ops: max arguments",
        "Most arguments per ops line (at least ops_min_args).",
        Bound(1, 9),
        1,
    )
    ops_seed: int = _ops(
        0, "ops: seed", "Seed of the ops generator (same seed, same text).", Bound(0, MAX_SEED), 1
    )

    def validate(self) -> DataConfig:
        """Raise ConfigError on the first bad field; return self when all are fine."""
        check_fields(self)
        if self.ops_max_args < self.ops_min_args:
            raise ConfigError(
                "ops_max_args", self.ops_max_args, f"must be >= ops_min_args={self.ops_min_args}"
            )
        return self
