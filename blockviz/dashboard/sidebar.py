"""The shared sidebar: every config field as a widget, presets, uploads, the run name.

Widget values live in st.session_state under `cfg.<field>`, so they persist across pages
(app.py renders the sidebar on every page). The RunConfig is built with blockviz.core.config and
validated there; the sidebar only shows the ConfigError it raises, under the field it names.
Number widgets take their min and max from config.BOUNDS. Text the user supplied (upload
names, run names, messages that quote them) is shown through `ui.plain`, never as Markdown.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import streamlit as st

from blockviz.core import config, corpora, params
from blockviz.core.config import ConfigError, DataConfig, ModelConfig, RunConfig
from blockviz.dashboard.store_access import store_path
from blockviz.dashboard.streamlit_compat import run_via_app
from blockviz.dashboard.ui import plain
from blockviz.store import StoreError, check_name, sanitize_name

PREFIX = "cfg."
PRESET_KEY = "cfg.preset"
UPLOAD_KEY = "cfg.upload"  # the file_uploader widget (its value cannot be set by code)
NAME_KEY = "run_name"
AUTO_NAME_KEY = "run_name_suggested"  # the last suggestion, to tell it from a typed name
UPLOAD_INFO_KEY = "upload_info"  # the accepted upload (survives the uploader's reset)
STATE_KEY = "sidebar_state"  # app.py hands this run's SidebarState to the page
DEFAULT_PRESET = "baby-cpu"
UPLOAD_CHOICE = "upload your own text"
DATASET_CHOICES = ("pydocs", "pycode", "shakespeare", "ops", UPLOAD_CHOICE)
DATASET_NOTES = {
    "pydocs": "Python's built-in help topics (~1 MB of English prose and code), offline.",
    "pycode": "Python standard-library source (first 2M characters), offline.",
    "shakespeare": "Tiny Shakespeare: downloads 1.1 MB once, then read from the cache.",
    "ops": "Synthetic lines like `max(3,9,2)=9`: val/answer_acc measures the answers.",
    UPLOAD_CHOICE: "Your own UTF-8 text (.txt, .md, .py, .csv), at most 20 MB.",
}
FINAL_NORM_CHOICES = ("auto", "on", "off")
UPLOAD_TYPES = ("txt", "md", "py", "csv")


@dataclass(frozen=True)
class Field:
    """How one config field appears as a widget."""

    name: str
    label: str
    kind: str  # select | bool | int | float | tristate
    help: str = ""
    options: Sequence[str] = ()
    step: float | int | None = None
    fmt: str | None = None


ARCHITECTURE = (
    Field(
        "norm_position",
        "Norm position",
        "select",
        "pre: x + f(norm(x)) · post: norm(x + f(x)) · none: no norms at all",
        config.NORM_POSITIONS,
    ),
    Field(
        "norm_type",
        "Norm type",
        "select",
        "RMSNorm drops the mean-centring and the bias",
        config.NORM_TYPES,
    ),
    Field("residual", "Residual (skip) connections", "bool", "off: x = f(x), no skip path"),
    Field(
        "residual_scale",
        "Residual scale",
        "float",
        "multiplier on each branch before it joins the stream",
        step=0.1,
        fmt="%.2f",
    ),
    Field("attention", "Attention sublayer", "bool", "off: FFN-only blocks (no token mixing)"),
    Field("ffn", "FFN sublayer", "bool", "off: attention-only blocks"),
    Field(
        "activation",
        "FFN activation",
        "select",
        "swiglu gates: silu(x W) * (x V), then W_out",
        config.ACTIVATIONS,
    ),
    Field("ffn_mult", "FFN width multiplier", "int", "d_ff = ffn_mult × d_model", step=1),
    Field("n_layer", "Layers (n_layer)", "int", "number of blocks", step=1),
    Field("n_head", "Heads (n_head)", "int", "must divide d_model", step=1),
    Field("d_model", "Width (d_model)", "int", "residual stream width", step=16),
    Field("block_size", "Context (block_size)", "int", "characters per sequence", step=16),
    Field("dropout", "Dropout", "float", "in [0, 1)", step=0.05, fmt="%.2f"),
    Field("bias", "Biases", "bool", "biases in Linear layers and LayerNorms"),
    Field("final_norm", "Final norm", "tristate", "auto: on for Pre-LN, off for Post-LN"),
    Field("tie_weights", "Tie embedding and LM head", "bool", "share one matrix"),
    Field(
        "init",
        "Initialisation",
        "select",
        "gpt2: N(0, 0.02), residual projections / sqrt(2·n_layer)",
        config.INITS,
    ),
)
TRAINING = (
    Field("batch_size", "Batch size", "int", "sequences per step", step=1),
    Field("max_steps", "Steps (max_steps)", "int", "optimizer steps", step=100),
    Field("lr", "Learning rate", "float", "peak learning rate", step=1e-4, fmt="%.1e"),
    Field("min_lr", "Minimum LR", "float", "floor of the decay", step=1e-5, fmt="%.1e"),
    Field("warmup_steps", "Warm-up steps", "int", "linear warm-up", step=10),
    Field("lr_schedule", "LR schedule", "select", "", config.LR_SCHEDULES),
    Field(
        "precision",
        "Precision",
        "select",
        "auto: bf16-mixed on a CUDA GPU that supports it, else 32-true",
        config.PRECISIONS,
    ),
    Field(
        "accelerator",
        "Accelerator",
        "select",
        "auto picks a GPU if one is visible",
        config.ACCELERATORS,
    ),
)
TRAINING_ADVANCED = (
    Field("weight_decay", "Weight decay", "float", "matrices only", step=0.01, fmt="%.3f"),
    Field("beta1", "Adam beta1", "float", "", step=0.001, fmt="%.3f"),
    Field("beta2", "Adam beta2", "float", "", step=0.001, fmt="%.3f"),
    Field("grad_clip", "Gradient clip", "float", "0 disables clipping", step=0.1, fmt="%.2f"),
    Field("devices", "Devices", "int", "per node", step=1),
    Field("num_nodes", "Nodes", "int", "", step=1),
    Field("strategy", "Strategy", "select", "ddp for several GPUs", config.STRATEGIES),
    Field("seed", "Seed", "int", "", step=1),
    Field("compile", "torch.compile", "bool", "worth it on a GPU, not on a laptop CPU"),
    Field("log_interval", "Log every (steps)", "int", "train loss / lr / throughput", step=1),
    Field("eval_interval", "Evaluate every (steps)", "int", "validation loss", step=10),
    Field("eval_iters", "Validation batches", "int", "per evaluation", step=1),
    Field("probe_interval", "Probe every (steps)", "int", "gradient / activation stats", step=10),
    Field("sample_interval", "Sample every (steps)", "int", "text samples, attention", step=10),
)
OPS_FIELDS = (
    Field("ops_examples", "ops: lines", "int", "", step=1000),
    Field("ops_min_args", "ops: min arguments", "int", "", step=1),
    Field("ops_max_args", "ops: max arguments", "int", "at most 9", step=1),
    Field("ops_seed", "ops: seed", "int", "", step=1),
)
VAL_FRACTION = Field(
    "val_fraction",
    "Validation fraction",
    "float",
    "the last part of the text",
    step=0.01,
    fmt="%.2f",
)
ALL_FIELDS = (*ARCHITECTURE, *TRAINING, *TRAINING_ADVANCED, *OPS_FIELDS, VAL_FRACTION)
_SPECS = {spec.name: spec for spec in ALL_FIELDS}
# Fields a run fills in itself: vocab_size comes from the dataset, dataset from its widget.
NOT_WIDGETS = ("vocab_size", "dataset")


@dataclass(frozen=True)
class UploadInfo:
    """An accepted upload: where it was saved and what it holds."""

    name: str  # the user's file name, for display only (never part of a path)
    path: str
    n_chars: int
    vocab_size: int
    sha256: str


@dataclass(frozen=True)
class SidebarState:
    """What the sidebar produced this run."""

    preset: str
    run_config: RunConfig | None  # None while the widgets make an invalid config
    error: ConfigError | None
    data_error: str | None  # a dataset problem (no upload yet, text too short)
    name: str  # the sanitized run name to launch with
    name_suggestion: str
    upload: UploadInfo | None
    model_for_params: config.ModelConfig | None  # also set when only the data is wrong
    name_error: str | None = None  # the run name cannot be used (a bare number)

    @property
    def can_launch(self) -> bool:
        """Whether Launch may be pressed."""
        return (
            self.run_config is not None
            and self.error is None
            and self.data_error is None
            and self.name_error is None
        )

    @property
    def problem(self) -> str | None:
        """The message that explains why Launch is disabled (plain text, not Markdown)."""
        if self.error is not None:
            return str(self.error)
        return self.data_error or self.name_error


# ------------------------------------------------------------------ widget <-> config values


def _to_widget(name: str, value: Any) -> Any:
    """A config value as its widget holds it."""
    if name == "final_norm":
        return {None: "auto", True: "on", False: "off"}[value]
    if name == "dataset":
        return value if value in DATASET_CHOICES else UPLOAD_CHOICE
    spec = _SPECS.get(name)
    if spec is not None and spec.kind == "float":
        return float(value)
    if spec is not None and spec.kind == "int":
        return int(value)
    return value


def _from_widget(name: str, value: Any) -> Any:
    """A widget value as the config field holds it."""
    if name == "final_norm":
        return {"auto": None, "on": True, "off": False}.get(value)
    return value


def apply_run_config(run_config: RunConfig) -> None:
    """Set every config widget to the values of `run_config`."""
    for section in config.SECTIONS:
        for f in fields(config.SECTIONS[section]):
            if f.name == "vocab_size":
                continue
            st.session_state[PREFIX + f.name] = _to_widget(
                f.name, getattr(getattr(run_config, section), f.name)
            )


def _apply_preset() -> None:
    """on_change of the preset select: every widget back to the preset's values."""
    name = st.session_state.get(PRESET_KEY, DEFAULT_PRESET)
    apply_run_config(config.preset(name))
    st.session_state.pop(NAME_KEY, None)  # the name follows the new preset again


def _values_from_state() -> dict[str, dict[str, Any]]:
    """Nested {section: {field: value}} from the widgets (dataset left to the caller)."""
    defaults = config.preset(st.session_state.get(PRESET_KEY, DEFAULT_PRESET)).to_dict()
    values: dict[str, dict[str, Any]] = {section: {} for section in config.SECTIONS}
    for section in config.SECTIONS:
        for name, default in defaults[section].items():
            if name in NOT_WIDGETS:
                values[section][name] = default
                continue
            key = PREFIX + name
            raw = st.session_state[key] if key in st.session_state else _to_widget(name, default)
            values[section][name] = _from_widget(name, raw)
    return values


# ------------------------------------------------------------------ run names

_NAME_TOKENS = {
    "norm_position": lambda v: {"pre": "pre-ln", "post": "post-ln", "none": "no-norm"}[v],
    "norm_type": lambda v: v,
    "residual": lambda v: "resid" if v else "no-resid",
    "residual_scale": lambda v: f"rs{v:g}",
    "attention": lambda v: "attn" if v else "no-attn",
    "ffn": lambda v: "ffn" if v else "no-ffn",
    "activation": lambda v: v,
    "ffn_mult": lambda v: f"ffn{v}x",
    "n_layer": lambda v: f"{v}L",
    "n_head": lambda v: f"{v}H",
    "d_model": lambda v: f"d{v}",
    "block_size": lambda v: f"ctx{v}",
    "bias": lambda v: "bias" if v else "nobias",
    "final_norm": lambda v: {None: "finalnorm-auto", True: "finalnorm", False: "no-finalnorm"}[v],
    "tie_weights": lambda v: "tied" if v else "untied",
    "init": lambda v: f"{v}-init",
    "max_steps": lambda v: f"{v}steps",
    "lr": lambda v: f"lr{v:g}",
    "dataset": lambda v: Path(v).stem if v not in DATASET_CHOICES else v,
}
MAX_NAME_TOKENS = 5


def suggest_name(preset_name: str, run_config: RunConfig) -> str:
    """A run name from what differs from the preset, e.g. 'post-ln-relu-6L'."""
    changed = config.diff(config.preset(preset_name), run_config)
    changed.pop("vocab_size", None)  # follows the dataset, which names itself
    # Sidebar order: the architecture choices a name is mostly about come first.
    order = {name: index for index, name in enumerate(_SPECS)}
    tokens = []
    for name, (_, new) in sorted(changed.items(), key=lambda item: order.get(item[0], len(order))):
        token = _NAME_TOKENS.get(name, lambda v, n=name: f"{n}{v}")(new)
        tokens.append(str(token))
    if not tokens:
        return preset_name
    shown = tokens[:MAX_NAME_TOKENS]
    if len(tokens) > MAX_NAME_TOKENS:
        shown.append(f"+{len(tokens) - MAX_NAME_TOKENS}")
    name = sanitize_name("-".join(shown))
    try:
        return check_name(name)
    except StoreError:  # an upload named 2024.txt: a bare number would read as a run id
        return f"run-{name}"


def checked_name(typed: str) -> tuple[str, str | None]:
    """The sanitised run name and, when it cannot be used (a bare number), why not."""
    try:
        return check_name(typed), None
    except StoreError as exc:
        return sanitize_name(typed), str(exc)


# ------------------------------------------------------------------ uploads


def uploads_dir() -> Path:
    """<workspace>/uploads: accepted uploads, named by content hash."""
    return store_path().parent / "uploads"


def accept_upload(data: bytes, display_name: str) -> UploadInfo:
    """Check uploaded bytes (UTF-8, non-empty, not binary, size, vocabulary) and save them.

    Raises corpora.DataError with a message for the user; nothing is written then. The
    saved file's name is the content's SHA-256 prefix, never the user's file name.
    """
    text = corpora.check_text_bytes(data, display_name)
    digest = hashlib.sha256(data).hexdigest()
    folder = uploads_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{digest[:16]}.txt"
    if not path.exists():
        partial = folder / f".{digest[:16]}.{os.getpid()}.part"
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)  # atomic: a concurrent reader never sees half a file
    vocab_size = corpora.CharVocab.from_text(text).size
    return UploadInfo(display_name, str(path), len(text), vocab_size, digest)


def _upload_widget() -> str | None:
    """The uploader; returns an error message for a refused upload."""
    uploaded = st.file_uploader(
        "Text file", type=list(UPLOAD_TYPES), key=UPLOAD_KEY, help=DATASET_NOTES[UPLOAD_CHOICE]
    )
    if uploaded is None:
        return None
    info: UploadInfo | None = st.session_state.get(UPLOAD_INFO_KEY)
    if uploaded.size > corpora.MAX_TEXT_BYTES:
        st.session_state.pop(UPLOAD_INFO_KEY, None)
        return (
            f"{uploaded.name} is {uploaded.size:,} bytes, larger than the "
            f"{corpora.MAX_TEXT_BYTES // 2**20} MiB limit; upload an excerpt of it"
        )
    data = uploaded.getvalue()
    if info is not None and info.sha256 == hashlib.sha256(data).hexdigest():
        return None  # the same file as last run: already checked and saved
    try:
        st.session_state[UPLOAD_INFO_KEY] = accept_upload(data, uploaded.name)
    except (corpora.DataError, OSError) as exc:
        # A refused upload must not leave an older file silently in use.
        st.session_state.pop(UPLOAD_INFO_KEY, None)
        return str(exc)
    return None


# ------------------------------------------------------------------ rendering


def widget_range(name: str, kind: str) -> tuple[int, int] | tuple[float, float]:
    """(min_value, max_value) of a number widget: the field's config.BOUNDS, typed."""
    bound = config.BOUNDS[name]
    if kind == "int":
        return int(bound.low), int(bound.high)
    return float(bound.low), float(bound.high)


def _clamp_state(key: str, low: float, high: float) -> None:
    """Bring a stored value into the widget's range (Streamlit would reset it to the min).

    Only a config set from elsewhere (`apply_run_config` with an older run's) can hold
    one; the nearest bound keeps it as close to what was asked as the widget allows.
    """
    value = st.session_state.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if value != value:  # NaN
        st.session_state[key] = low
    elif value < low or value > high:
        st.session_state[key] = min(max(value, low), high)


def _widget(spec: Field, error: ConfigError | None) -> None:
    key = PREFIX + spec.name
    if spec.kind in ("select", "tristate"):
        options = FINAL_NORM_CHOICES if spec.kind == "tristate" else spec.options
        st.selectbox(spec.label, options, key=key, help=spec.help or None)
    elif spec.kind == "bool":
        st.toggle(spec.label, key=key, help=spec.help or None)
    else:
        low, high = widget_range(spec.name, spec.kind)  # _initialise clamped the value
        if spec.kind == "int":
            step, fmt = int(spec.step or 1), None
        else:
            step, fmt = float(spec.step or 0.1), spec.fmt
        st.number_input(
            spec.label,
            min_value=low,
            max_value=high,
            step=step,
            format=fmt,
            key=key,
            help=spec.help or None,
        )
    if error is not None and error.field == spec.name:
        st.error(str(error), icon=":material/error:")


def _group(title: str, specs: Sequence[Field], error: ConfigError | None, expanded: bool) -> None:
    holds_error = error is not None and any(s.name == error.field for s in specs)
    with st.expander(title, expanded=expanded or holds_error):
        for spec in specs:
            _widget(spec, error)


def _initialise() -> None:
    """First run of a session: the default preset; later runs: keep values off-page too."""
    if PRESET_KEY not in st.session_state:
        st.session_state[PRESET_KEY] = DEFAULT_PRESET
        apply_run_config(config.preset(DEFAULT_PRESET))
    # Re-assigning keeps a value whose widget is not drawn this run (the ops fields while
    # another dataset is chosen) from being dropped by Streamlit's widget cleanup.
    for key in list(st.session_state.keys()):
        if str(key).startswith(PREFIX) and key != UPLOAD_KEY:
            st.session_state[key] = st.session_state[key]
    # Before anything reads them: the config, the count and the widgets see one value.
    for spec in ALL_FIELDS:
        if spec.kind in ("int", "float"):
            _clamp_state(PREFIX + spec.name, *widget_range(spec.name, spec.kind))


def _build(values: dict[str, dict[str, Any]]) -> tuple[RunConfig | None, ConfigError | None]:
    try:
        return RunConfig.from_dict(values).validate(), None
    except ConfigError as exc:
        return None, exc


@st.cache_data(show_spinner=False, max_entries=32)
def _builtin_vocab_size(data: dict[str, Any]) -> int:
    """The vocabulary a run on this built-in dataset will have, so the counts shown match.

    Reads the corpus (milliseconds; cached). Tiny Shakespeare's is known without reading
    or downloading it; a dataset that cannot be read keeps the default, and Launch says why.
    """
    if data.get("dataset") == "shakespeare":  # its SHA-256 pins the text; never download here
        return corpora.SHAKESPEARE_VOCAB_SIZE
    try:
        text = corpora.load_corpus(DataConfig(**data).validate()).text
        return corpora.CharVocab.from_text(text).size
    except (corpora.DataError, ConfigError, OSError, TypeError, ValueError):
        return ModelConfig().vocab_size


def _with_dataset(
    values: dict[str, dict[str, Any]], dataset_choice: str, upload: UploadInfo | None
) -> tuple[RunConfig | None, ConfigError | None, str | None]:
    """Validate the widgets' values with the chosen dataset; (config, error, data problem)."""
    data_error = None
    values = {section: dict(part) for section, part in values.items()}
    if dataset_choice != UPLOAD_CHOICE:
        values["data"]["dataset"] = dataset_choice
        values["model"]["vocab_size"] = _builtin_vocab_size(values["data"])
    elif upload is None:
        values["data"]["dataset"] = UPLOAD_CHOICE  # a stand-in so the other fields validate
        data_error = "dataset: no text uploaded yet; upload a UTF-8 text file or pick a corpus"
    else:
        values["data"]["dataset"] = upload.path
        values["model"]["vocab_size"] = upload.vocab_size
    run_config, error = _build(values)
    if run_config is not None and upload is not None and dataset_choice == UPLOAD_CHOICE:
        try:
            corpora.check_split(
                upload.n_chars,
                run_config.data.val_fraction,
                run_config.model.block_size,
                upload.name,
            )
        except corpora.DataError as exc:
            data_error = str(exc)
    return run_config, error, data_error


def _described(
    values: dict[str, dict[str, Any]], dataset_choice: str, upload: UploadInfo | None
) -> RunConfig | None:
    """The widgets' config unvalidated (for the count, the diagram and the name), or None."""
    described = {section: dict(part) for section, part in values.items()}
    if upload is not None:
        described["model"]["vocab_size"] = upload.vocab_size
        described["data"]["dataset"] = upload.name  # only the name suggestion reads it
    elif dataset_choice != UPLOAD_CHOICE:
        described["data"]["dataset"] = dataset_choice
        described["model"]["vocab_size"] = _builtin_vocab_size(described["data"])
    try:
        return RunConfig.from_dict(described)
    except ConfigError:
        return None


def render_sidebar() -> SidebarState:
    """Draw the sidebar and return the config it describes (or the error that blocks it)."""
    _initialise()
    preset_name = st.session_state[PRESET_KEY]
    values = _values_from_state()
    dataset_choice = st.session_state.get(PREFIX + "dataset", "pydocs")
    # Field errors are known before drawing (widget values are in session state already),
    # so each can sit under its widget; only an upload needs its widget drawn first.
    _, error, _ = _with_dataset(values, dataset_choice, st.session_state.get(UPLOAD_INFO_KEY))
    with st.sidebar:
        st.selectbox(
            "Start from a preset",
            list(config.PRESETS),
            key=PRESET_KEY,
            on_change=_apply_preset,
            help="Choosing a preset resets every field below to it.",
        )
        st.caption(config.PRESET_DESCRIPTIONS.get(preset_name, ""))
        summary = st.container()
        _group("Architecture", ARCHITECTURE, error, expanded=True)
        _group("Training", TRAINING, error, expanded=False)
        _group("Training: advanced", TRAINING_ADVANCED, error, expanded=False)
        upload_error = _data_group(error, dataset_choice)
        upload = None if upload_error else st.session_state.get(UPLOAD_INFO_KEY)
        if dataset_choice != UPLOAD_CHOICE:
            upload = None
        run_config, error, data_error = _with_dataset(values, dataset_choice, upload)
        data_error = upload_error or data_error
        described = _described(values, dataset_choice, upload)
        suggestion = suggest_name(preset_name, described) if described else preset_name
        with summary:
            _parameter_metric(described)
            _name_follows(suggestion)
            st.text_input(
                "Run name", key=NAME_KEY, help="Suggested from what differs from the preset"
            )
            name, name_error = checked_name(st.session_state.get(NAME_KEY) or suggestion)
            if name_error is not None:
                st.error(plain(name_error), icon=":material/error:")
            if error is not None:
                field_name = plain(error.field)
                st.error(f"Cannot launch: fix **{field_name}** below.", icon=":material/block:")
            elif data_error is not None:
                st.warning(f"Cannot launch: {plain(data_error)}", icon=":material/block:")
            elif name_error is not None:
                st.warning("Cannot launch: change the run name.", icon=":material/block:")
    return SidebarState(
        preset=preset_name,
        run_config=run_config if error is None else None,
        error=error,
        data_error=data_error,
        name=name,
        name_suggestion=suggestion,
        upload=upload,
        model_for_params=described.model if described is not None else None,
        name_error=name_error,
    )


def _name_follows(suggestion: str) -> None:
    """Keep the name on the suggestion until the user types one of their own."""
    current = st.session_state.get(NAME_KEY)
    if not current or current == st.session_state.get(AUTO_NAME_KEY):
        st.session_state[NAME_KEY] = suggestion
    st.session_state[AUTO_NAME_KEY] = suggestion


def _parameter_metric(run_config: RunConfig | None) -> None:
    if run_config is None:
        st.metric("Parameters", "—")
        return
    try:
        total = params.param_breakdown(run_config.model).total
    except (ValueError, ArithmeticError):
        st.metric("Parameters", "—")
        return
    st.metric(
        "Parameters",
        f"{total:,}",
        help=f"for vocab_size {run_config.model.vocab_size} (set from the dataset when a run "
        "starts); the Parameters page has the breakdown",
    )


def _data_group(error: ConfigError | None, dataset_choice: str) -> str | None:
    """The Data expander; returns a refused upload's message (shown there too)."""
    upload_error = None
    data_fields = ("dataset", "val_fraction", *(f.name for f in OPS_FIELDS))
    holds_error = error is not None and error.field in data_fields
    with st.expander("Data", expanded=holds_error or dataset_choice == UPLOAD_CHOICE):
        st.selectbox("Dataset", DATASET_CHOICES, key=PREFIX + "dataset")
        st.caption(DATASET_NOTES[dataset_choice])
        if dataset_choice == "ops":
            for spec in OPS_FIELDS:
                _widget(spec, error)
        if dataset_choice == UPLOAD_CHOICE:
            upload_error = _upload_widget()
            info: UploadInfo | None = st.session_state.get(UPLOAD_INFO_KEY)
            if upload_error is not None:
                st.error(f"Upload refused: {plain(upload_error)}", icon=":material/error:")
            elif info is not None:
                st.caption(
                    f"Using {plain(info.name)}: {info.n_chars:,} characters, "
                    f"{info.vocab_size} distinct."
                )
        _widget(VAL_FRACTION, error)
    return upload_error


def state() -> SidebarState:
    """This run's SidebarState: the one app.py rendered, or render it (a page run alone)."""
    current = st.session_state.get(STATE_KEY)
    if isinstance(current, SidebarState):
        return current
    run_via_app()
    return render_sidebar()
