"""Run configuration: model, training and data dataclasses, validation, JSON, diff and replace.

Every field is a plain value so a config is JSON on disk, a flag on the CLI and a widget in
the sidebar. `validate()` raises `ConfigError` naming the field, the bad value and what is
allowed; every numeric field has a lower and an upper bound, kept in `core.bounds.BOUNDS`.
The named presets are `core.presets` (`preset()` here builds one). Nothing here imports
torch, so the UI can validate on every keystroke.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field, fields
from typing import Any, get_args, get_origin, get_type_hints

from blockviz.core.bounds import BOUNDS
from blockviz.core.presets import PRESETS

NORM_POSITIONS = ("pre", "post", "none")
NORM_TYPES = ("layernorm", "rmsnorm", "batchnorm")
ACTIVATIONS = ("gelu", "relu", "silu", "swiglu")
INITS = ("default", "gpt2", "xavier")
LR_SCHEDULES = ("constant", "cosine", "linear")
PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed")
ACCELERATORS = ("auto", "cpu", "gpu", "mps")
STRATEGIES = ("auto", "ddp")
LOGGERS = ("none", "tensorboard", "csv")  # Lightning loggers a run writes besides the store


def _shown(value: Any) -> str:
    """repr(value) for a message, kept to one short line whatever the value is."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        # repr() of an int past 4300 digits raises; the size is what the user needs anyway
        return f"an integer of {math.floor(value.bit_length() * math.log10(2)) + 1:,} digits"
    text = repr(value)
    if len(text) > 80:
        return f"{text[:60]}… ({len(text):,} characters)"
    return text


class ConfigError(ValueError):
    """A config field holds a value that is not allowed; the message names all three."""

    def __init__(
        self, field_name: str, value: Any, allowed: str, message: str | None = None
    ) -> None:
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(message or f"{field_name}: {_shown(value)} is not allowed; {allowed}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, value, "choose one of " + ", ".join(choices))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name: str, value: Any) -> None:
    """ConfigError unless `value` is an integer within BOUNDS[name]."""
    bound = BOUNDS[name]
    if not (_is_int(value) and bound.contains(value)):
        raise ConfigError(name, value, "must be " + bound.describe(integer=True))


def check_number(name: str, value: Any) -> None:
    """ConfigError unless `value` is a finite number within BOUNDS[name]."""
    bound = BOUNDS[name]
    if not (_is_number(value) and bound.contains(value)):
        raise ConfigError(name, value, "must be " + bound.describe(integer=False))


def _number(name: str, value: Any, low: float, high: float) -> None:
    """A number in [low, high], for ranges that depend on another field."""
    if not (_is_number(value) and low <= value <= high):
        raise ConfigError(name, value, f"must be a number in [{low}, {high}]")


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(name, value, "must be true or false")


@dataclass
class ModelConfig:
    """Shape and wiring of the CharTransformer; every block toggle is a field."""

    vocab_size: int = 65  # set from the dataset's vocabulary when a run starts
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    block_size: int = 64  # context length in characters
    dropout: float = 0.0  # small models on small corpora rarely need it at first
    bias: bool = True  # biases in Linear layers and norms (GPT-2 has them)
    norm_position: str = "pre"  # pre: x + f(norm(x)); post: norm(x + f(x)); none: no norms
    norm_type: str = "layernorm"  # rmsnorm drops the mean-centring and the bias; batchnorm
    # normalises each channel over the batch and positions (running statistics in eval)
    residual: bool = True  # off: x = f(x), the block without its skip path
    residual_scale: float = 1.0  # multiplier on each branch before it joins the stream
    attention: bool = True  # off: FFN-only blocks (no token mixing at all)
    ffn: bool = True  # off: attention-only blocks
    ffn_mult: int = 4  # d_ff = ffn_mult * d_model; 4 is the GPT-2 / original choice
    activation: str = "gelu"  # swiglu gates: silu(x W) * (x V), then W_out
    final_norm: bool | None = None  # None = auto: on for pre, off for post and none
    tie_weights: bool = False  # share the token embedding with the LM head
    init: str = "default"  # gpt2: N(0, 0.02) (residual projections smaller); xavier: Glorot
    # Normalise each head's queries and keys before their dot product (Dehghani et al. 2023,
    # Wortsman et al. 2023): the attention logits then no longer grow with the size of q and
    # k, a growth that can collapse each softmax onto one key and destabilise training.
    qk_norm: bool = False
    # c > 0: logits = c·tanh(logits / c), so none leaves (-c, c) (Gemma 2 caps at 30); 0: off
    logit_softcap: float = 0.0

    @property
    def d_ff(self) -> int:
        """Hidden width of the FFN."""
        return self.ffn_mult * self.d_model

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_head

    @property
    def use_final_norm(self) -> bool:
        """Whether a norm sits before the LM head, resolving the `None` default."""
        if self.norm_position == "none":
            return False
        if self.final_norm is None:
            return self.norm_position == "pre"
        return self.final_norm

    def validate(self) -> ModelConfig:
        """Raise ConfigError on the first bad field; return self when all are fine."""
        check_int("vocab_size", self.vocab_size)
        check_int("n_layer", self.n_layer)
        check_int("n_head", self.n_head)
        check_int("d_model", self.d_model)
        check_int("block_size", self.block_size)
        check_number("dropout", self.dropout)
        _bool("bias", self.bias)
        _choice("norm_position", self.norm_position, NORM_POSITIONS)
        _choice("norm_type", self.norm_type, NORM_TYPES)
        _bool("residual", self.residual)
        check_number("residual_scale", self.residual_scale)
        _bool("attention", self.attention)
        _bool("ffn", self.ffn)
        if not (self.attention or self.ffn):
            raise ConfigError(
                "ffn", self.ffn, "attention and ffn cannot both be off (the block would be empty)"
            )
        check_int("ffn_mult", self.ffn_mult)
        _choice("activation", self.activation, ACTIVATIONS)
        if self.final_norm is not None:
            _bool("final_norm", self.final_norm)
        _bool("tie_weights", self.tie_weights)
        _choice("init", self.init, INITS)
        _bool("qk_norm", self.qk_norm)
        check_number("logit_softcap", self.logit_softcap)
        if self.attention and self.d_model % self.n_head:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            raise ConfigError(
                "n_head",
                self.n_head,
                f"must divide d_model={self.d_model}; try one of {', '.join(map(str, divisors))}",
            )
        return self


# Which tensors weight_decay reaches, as training.lit.param_groups builds AdamW's groups
# (tests/training/test_lit.py checks that function tensor by tensor): the sidebar, the CLI's --help,
# the generated script and README say this.
WEIGHT_DECAY_HELP = (
    "AdamW decay on the Linear weight matrices only: attention qkv and output, FFN in and "
    "out, the LM head (a tied token embedding is the LM head's matrix, so it decays too); "
    "none on biases, norm gains or the untied token and position embeddings"
)


@dataclass
class TrainConfig:
    """Optimisation, schedule, hardware and logging cadence of a run."""

    batch_size: int = 12
    max_steps: int = 2000
    lr: float = 1e-3
    min_lr: float = 1e-4  # floor of the cosine / linear decay
    warmup_steps: int = 100  # linear warm-up; Post-LN needs it to survive high lr
    lr_schedule: str = "cosine"
    weight_decay: float = 0.1  # WEIGHT_DECAY_HELP says which tensors it reaches
    beta1: float = 0.9
    beta2: float = 0.99  # small batches of characters: a shorter second-moment memory helps
    grad_clip: float = 1.0  # 0 disables clipping
    # Adds z_loss·mean((log Z)²) to the objective, log Z the logsumexp of a position's logits
    # (PaLM: 1e-4), pulling the softmax normaliser towards 1; 0: off. train/loss stays the
    # cross-entropy alone, so runs with and without it compare on one scale.
    z_loss: float = 0.0
    precision: str = "auto"  # auto: bf16-mixed on a CUDA GPU that supports it, else 32-true
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"  # ddp for several GPUs; Lightning does the rest
    seed: int = 1337
    log_interval: int = 1  # steps between train-loss / lr / throughput records
    eval_interval: int = 100
    eval_iters: int = 20  # validation batches per evaluation
    probe_interval: int = 50  # steps between gradient / activation / update probes (and step 0)
    sample_interval: int = 500  # steps between generated samples and attention maps
    compile: bool = False  # torch.compile the model (worth it on a GPU, not on a laptop CPU)
    logger: str = "none"  # tensorboard | csv: also write metrics and layer stats in run_dir
    # Steps between kept checkpoints, the steps a fork or a replay can start from
    # (`training.keep`); 0 keeps none. At most ckpt_keep are kept: one more doubles the
    # spacing and drops the checkpoints off it (the first one stays).
    ckpt_interval: int = 100
    ckpt_keep: int = 8

    def validate(self) -> TrainConfig:
        """Raise ConfigError on the first bad field; return self when all are fine."""
        check_int("batch_size", self.batch_size)
        check_int("max_steps", self.max_steps)
        check_number("lr", self.lr)
        check_number("min_lr", self.min_lr)
        _number("min_lr", self.min_lr, 0.0, self.lr)
        check_int("warmup_steps", self.warmup_steps)
        _choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_number("weight_decay", self.weight_decay)
        check_number("beta1", self.beta1)
        check_number("beta2", self.beta2)
        check_number("grad_clip", self.grad_clip)
        check_number("z_loss", self.z_loss)
        _choice("precision", self.precision, PRECISIONS)
        _choice("accelerator", self.accelerator, ACCELERATORS)
        check_int("devices", self.devices)
        check_int("num_nodes", self.num_nodes)
        _choice("strategy", self.strategy, STRATEGIES)
        check_int("seed", self.seed)
        check_int("log_interval", self.log_interval)
        check_int("eval_interval", self.eval_interval)
        check_int("eval_iters", self.eval_iters)
        check_int("probe_interval", self.probe_interval)
        check_int("sample_interval", self.sample_interval)
        _bool("compile", self.compile)
        _choice("logger", self.logger, LOGGERS)
        check_int("ckpt_interval", self.ckpt_interval)
        check_int("ckpt_keep", self.ckpt_keep)
        return self


@dataclass
class DataConfig:
    """Which characters a run trains on and how they are split."""

    dataset: str = "pydocs"  # pydocs | pycode | shakespeare | ops | a path to a UTF-8 file
    val_fraction: float = 0.1  # the last 10% of the text is validation, never trained on
    ops_examples: int = 20000  # lines generated for the synthetic `ops` task
    ops_min_args: int = 2
    ops_max_args: int = 5
    ops_seed: int = 0

    def validate(self) -> DataConfig:
        """Raise ConfigError on the first bad field; return self when all are fine."""
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise ConfigError(
                "dataset",
                self.dataset,
                "name a built-in corpus (pydocs, pycode, shakespeare, ops) or a text file",
            )
        check_number("val_fraction", self.val_fraction)
        check_int("ops_examples", self.ops_examples)
        check_int("ops_min_args", self.ops_min_args)
        check_int("ops_max_args", self.ops_max_args)
        if self.ops_max_args < self.ops_min_args:
            raise ConfigError(
                "ops_max_args", self.ops_max_args, f"must be >= ops_min_args={self.ops_min_args}"
            )
        check_int("ops_seed", self.ops_seed)
        return self


@dataclass
class RunConfig:
    """Everything a training run needs: model + train + data, saved as JSON with the run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def validate(self) -> RunConfig:
        """Validate all three parts and the rules that span them."""
        self.model.validate()
        self.train.validate()
        self.data.validate()
        if self.train.warmup_steps > self.train.max_steps:
            raise ConfigError(
                "warmup_steps",
                self.train.warmup_steps,
                f"must be <= max_steps={self.train.max_steps}",
            )
        return self

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict: {"model": {...}, "train": {...}, "data": {...}}."""
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text that `from_json` turns back into an equal config."""
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Build from a nested dict; unknown sections or fields raise ConfigError."""
        if not isinstance(data, dict):
            raise ConfigError("config", type(data).__name__, "must be a JSON object")
        unknown = set(data) - {"model", "train", "data"}
        if unknown:
            raise ConfigError(sorted(unknown)[0], "?", "sections are model, train and data")
        parts = {}
        for section, section_cls in SECTIONS.items():
            values = data.get(section, {})
            if not isinstance(values, dict):
                raise ConfigError(section, values, "must be a JSON object of field: value")
            parts[section] = from_dict(section_cls, values)
        return cls(**parts)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        """Parse JSON text produced by `to_json` (or written by hand)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("config", text[:40], f"is not valid JSON ({exc.msg})") from None
        except RecursionError:
            # A config is three levels deep; thousands of brackets are never one.
            raise ConfigError(
                "config", text[:40], "nests too deeply to be a config (sections, fields, values)"
            ) from None
        except ValueError:
            # Python refuses to read an integer past sys.get_int_max_str_digits() digits.
            raise ConfigError(
                "config",
                text[:40],
                f"holds a number of more than {sys.get_int_max_str_digits():,} digits; "
                "no config field takes one",
            ) from None
        return cls.from_dict(data)


SECTIONS: dict[str, type] = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}


def field_types(cls: type) -> dict[str, Any]:
    """Resolved type hints of a config dataclass's fields, by name."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def coerce(name: str, text: str, annotation: Any) -> Any:
    """Turn a flag's text into the field's type, or raise ConfigError naming the field."""
    raw = text.strip()
    optional = get_origin(annotation) is not None and type(None) in get_args(annotation)
    if optional:
        if raw.lower() in ("auto", "none", "null"):
            return None
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    if annotation is bool:
        lowered = raw.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ConfigError(name, text, "must be true or false")
    if annotation is int:
        allowed = "must be " + (
            BOUNDS[name].describe(integer=True) if name in BOUNDS else "an integer"
        )
        try:
            return int(raw)
        except ValueError:
            # Also digits past Python's int-from-text limit: far out of every range anyway.
            raise ConfigError(name, text, allowed) from None
    if annotation is float:
        try:
            # 1e999 reads as inf and "nan" as nan; validate() refuses both by name.
            return float(raw)
        except ValueError:
            raise ConfigError(name, text, "must be a number") from None
    return raw


def from_dict(cls: type, values: dict[str, Any]) -> Any:
    """Build one config dataclass from a dict, rejecting unknown fields by name."""
    if not isinstance(values, dict):
        raise ConfigError(cls.__name__, values, "must be a JSON object")
    types = field_types(cls)
    for name in values:
        if name not in types:
            raise ConfigError(name, values[name], f"is not a field of {cls.__name__}")
    kwargs = {}
    for name, value in values.items():
        # JSON has no int/float distinction for whole numbers: 1.0 is a fine lr.
        if types[name] is float and _is_int(value) and abs(value) < 2**1023:
            value = float(value)  # a larger int stays one, for validate() to refuse
        kwargs[name] = value
    return cls(**kwargs)


def replace(config: RunConfig, **overrides: Any) -> RunConfig:
    """A copy of `config` with fields overridden by bare name (`n_layer=2, lr=3e-4`)."""
    parts = {key: dataclasses.asdict(getattr(config, key)) for key in SECTIONS}
    for name, value in overrides.items():
        section = section_of(name)
        parts[section][name] = value
    return RunConfig.from_dict(parts)


def section_of(name: str) -> str:
    """Which section (model / train / data) owns a field name."""
    for section, cls in SECTIONS.items():
        if name in field_types(cls):
            return section
    raise ConfigError(name, "?", "is not a config field")


def preset(name: str) -> RunConfig:
    """The RunConfig of a named preset."""
    if name not in PRESETS:
        raise ConfigError("preset", name, "choose one of " + ", ".join(PRESETS))
    return replace(RunConfig(), **PRESETS[name])


def diff(a: RunConfig, b: RunConfig) -> dict[str, tuple[Any, Any]]:
    """Fields whose values differ between two configs, by bare field name."""
    out: dict[str, tuple[Any, Any]] = {}
    da, db = a.to_dict(), b.to_dict()
    for section in SECTIONS:
        for name, value in da[section].items():
            if db[section][name] != value:
                out[name] = (value, db[section][name])
    return out
