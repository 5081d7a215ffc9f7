"""The shared sidebar: presets, live parameter count, inline errors, run names, uploads."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from blockviz.core import config, corpora, params
from blockviz.core.bounds import MAX_VOCAB
from blockviz.core.config import BOUNDS
from blockviz.core.config_model import ModelConfig
from blockviz.core.config_train import DataConfig
from blockviz.core.naming import MAX_NAME_TOKENS
from blockviz.core.presets import DEFAULT_PRESET
from blockviz.core.vocab import DataError
from blockviz.dashboard import (
    config_fields,
    run_names,
    sidebar,
    streamlit_compat,
    uploads,
    url_config,
)
from blockviz.store import default_store_path
from tests.helpers import autolinks, shown

TIMEOUT = 30
APP = str(Path(__file__).resolve().parents[2] / "app.py")


@pytest.fixture
def app() -> AppTest:
    """The whole app, first run done (the Train page)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    return at.run()


def metric_total(at: AppTest) -> int:
    (metric,) = [m for m in at.sidebar.metric if m.label == "Parameters"]
    return int(metric.value.replace(",", ""))


def launch_disabled(at: AppTest) -> bool:
    return at.button(key="launch").disabled


def errors(at: AppTest) -> str:
    return "\n".join(e.value for e in at.error)


def uploads_dir() -> Path:
    return default_store_path().absolute().parent / "uploads"


# ------------------------------------------------------------------ pure parts


def test_every_config_field_has_a_widget() -> None:
    wanted = {f.name for cls in config.SECTIONS.values() for f in dataclasses.fields(cls)} - set(
        config_fields.NOT_WIDGETS
    )
    assert {spec.name for spec in config_fields.ALL_FIELDS} == wanted
    # Architecture comes first and holds every ModelConfig widget.
    model_fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"}
    assert {spec.name for spec in config_fields.ARCHITECTURE} == model_fields


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, "baby-cpu"),
        ({"norm_position": "post", "activation": "relu", "n_layer": 6}, "post-ln-relu-6L"),
        ({"residual": False, "lr": 3e-4}, "no-resid-lr0.0003"),
        ({"attention": False, "dataset": "/data/My Notes.txt"}, "no-attn-My Notes"),
        ({"vocab_size": 97, "dataset": "pycode"}, "pycode"),  # the vocabulary follows the data
        ({"dataset": "/data/2024.txt"}, "run-2024"),  # never a bare number (a run id)
        ({"qk_norm": True, "logit_softcap": 30.0}, "qknorm-softcap30"),
        ({"z_loss": 1e-4, "lr": 3e-3}, "lr0.003-zloss0.0001"),
    ],
)
def test_suggested_name_lists_what_differs(overrides: dict, expected: str) -> None:
    run_config = config.replace(config.preset("baby-cpu"), **overrides)
    assert run_names.suggest_name("baby-cpu", run_config) == expected


def test_suggested_name_stays_short_with_many_changes() -> None:
    changes = {"n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 32, "dropout": 0.1}
    changes |= {"bias": False, "init": "gpt2"}
    name = run_names.suggest_name("baby-cpu", config.replace(config.preset("baby-cpu"), **changes))
    assert name.endswith(f"+{len(changes) - MAX_NAME_TOKENS}")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
        (b"caf\xe9 latin-1", "not UTF-8"),
        (
            "".join(chr(0x4E00 + i) for i in range(MAX_VOCAB + 1)).encode(),
            f"{MAX_VOCAB + 1:,} distinct characters, more than the {MAX_VOCAB:,}",
        ),
    ],
    ids=["empty", "binary", "latin-1", "too-many-symbols"],
)
def test_bad_uploads_are_refused_and_not_saved(data: bytes, message: str) -> None:
    with pytest.raises(DataError, match=message):
        uploads.accept_upload(data, "notes.txt")
    assert not uploads_dir().exists() or not any(uploads_dir().iterdir())


def test_accepted_upload_is_saved_under_its_hash_not_its_name() -> None:
    data = b"hello, blockviz\r\n" * 10
    info = uploads.accept_upload(data, "../../etc/evil name.txt")
    expected = uploads_dir() / f"{hashlib.sha256(data).hexdigest()[:16]}.txt"
    assert Path(info.path) == expected and expected.is_file()
    assert expected.read_text(encoding="utf-8") == "hello, blockviz\n" * 10
    assert info.n_chars == len("hello, blockviz\n") * 10
    assert info.vocab_size == len(set("hello, blockviz\n"))
    assert [p.name for p in uploads_dir().iterdir()] == [expected.name]


# ------------------------------------------------------------------ the rendered sidebar


def dataset_vocab(dataset: str) -> int:
    return len(set(corpora.load_corpus(DataConfig(dataset=dataset)).text))


def test_parameter_total_follows_the_widgets(app: AppTest) -> None:
    assert not app.exception
    # The count is for the vocabulary the run will have: the chosen dataset's.
    default = dataclasses.replace(
        config.preset(DEFAULT_PRESET).model, vocab_size=dataset_vocab("pydocs")
    )
    assert default.vocab_size != ModelConfig().vocab_size  # pydocs has more than 65
    assert metric_total(app) == params.param_breakdown(default).total
    app.number_input(key="cfg.n_layer").set_value(7).run()
    assert (
        metric_total(app) == params.param_breakdown(dataclasses.replace(default, n_layer=7)).total
    )
    assert not launch_disabled(app)


@pytest.mark.parametrize("dataset", ["ops", "pycode"])
def test_parameter_total_uses_the_chosen_datasets_vocabulary(app: AppTest, dataset: str) -> None:
    app.selectbox(key="cfg.dataset").set_value(dataset).run()
    model = dataclasses.replace(
        config.preset(DEFAULT_PRESET).model, vocab_size=dataset_vocab(dataset)
    )
    assert metric_total(app) == params.param_breakdown(model).total
    assert app.text_input(key=sidebar.NAME_KEY).value == dataset  # no "vocab_size..." token


def test_invalid_combination_names_the_field_and_disables_launch(app: AppTest) -> None:
    app.number_input(key="cfg.d_model").set_value(130).run()
    app.number_input(key="cfg.n_head").set_value(4).run()
    assert not app.exception
    assert "n_head" in errors(app) and "must divide d_model=130" in errors(app)
    assert launch_disabled(app)
    app.number_input(key="cfg.d_model").set_value(128).run()
    assert "n_head" not in errors(app) and not launch_disabled(app)


def test_choosing_a_preset_resets_the_widgets(app: AppTest) -> None:
    app.number_input(key="cfg.n_layer").set_value(9).run()
    app.selectbox(key="cfg.preset").set_value("postln-original").run()
    target = config.preset("postln-original")
    assert app.selectbox(key="cfg.norm_position").value == "post"
    assert app.selectbox(key="cfg.activation").value == target.model.activation
    assert app.number_input(key="cfg.n_layer").value == target.model.n_layer
    assert app.selectbox(key="cfg.final_norm").value == "off"
    assert app.text_input(key=sidebar.NAME_KEY).value == "postln-original"


def test_values_survive_a_page_switch(app: AppTest) -> None:
    app.number_input(key="cfg.n_layer").set_value(6).run()
    app.selectbox(key="cfg.dataset").set_value("ops").run()
    app.number_input(key="cfg.ops_max_args").set_value(7).run()
    app.selectbox(key="cfg.dataset").set_value("pydocs").run()  # the ops fields leave the page
    app.switch_page("pages/parameters.py").run()
    assert not app.exception
    assert app.number_input(key="cfg.n_layer").value == 6
    app.selectbox(key="cfg.dataset").set_value("ops").run()
    assert app.number_input(key="cfg.ops_max_args").value == 7


def test_name_follows_the_suggestion_until_typed(app: AppTest) -> None:
    app.selectbox(key="cfg.norm_position").set_value("post").run()
    assert app.text_input(key=sidebar.NAME_KEY).value == "post-ln"
    app.text_input(key=sidebar.NAME_KEY).set_value("my run/1").run()
    app.selectbox(key="cfg.activation").set_value("relu").run()
    assert app.text_input(key=sidebar.NAME_KEY).value == "my run/1"
    assert any("my run-1" in m.value for m in app.markdown)  # the name Launch uses


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x01\x02 not text" * 100, "looks binary"),
        (b"a" * (corpora.MAX_TEXT_BYTES + 1), "larger than"),
        (b"short text", "too short"),
    ],
    ids=["binary", "too-large", "too-short"],
)
def test_refused_uploads_show_a_message_and_block_launch(
    app: AppTest, data: bytes, message: str
) -> None:
    app.selectbox(key="cfg.dataset").set_value(config_fields.UPLOAD_CHOICE).run()
    assert launch_disabled(app)  # nothing uploaded yet
    app.file_uploader(key=uploads.UPLOAD_KEY).set_value(("notes.txt", data, "text/plain")).run()
    assert not app.exception
    shown = errors(app) + "\n".join(w.value for w in app.warning)
    assert message in shown
    assert launch_disabled(app)


def test_good_upload_becomes_the_dataset(app: AppTest) -> None:
    text = "".join(f"line {i}: the quick brown fox\n" for i in range(200))
    app.selectbox(key="cfg.dataset").set_value(config_fields.UPLOAD_CHOICE).run()
    app.file_uploader(key=uploads.UPLOAD_KEY).set_value(
        ("fox.txt", text.encode(), "text/plain")
    ).run()
    assert not app.exception and not errors(app)
    assert not launch_disabled(app)
    saved = list(uploads_dir().iterdir())
    assert len(saved) == 1 and saved[0].name != "fox.txt"
    # The vocabulary of the upload sizes the embedding in the live parameter count.
    model = dataclasses.replace(config.preset("baby-cpu").model, vocab_size=len(set(text)))
    assert metric_total(app) == params.param_breakdown(model).total


# ------------------------------------------------------------------ issue 10


NUMBER_SPECS = [spec for spec in config_fields.ALL_FIELDS if spec.kind in ("int", "float")]


def test_number_widgets_take_their_range_from_the_config_bounds(app: AppTest) -> None:
    app.selectbox(key="cfg.dataset").set_value("ops").run()  # draws the ops fields too
    assert {spec.name for spec in NUMBER_SPECS} == set(BOUNDS) - {"vocab_size"}
    for spec in NUMBER_SPECS:
        widget = app.number_input(key=sidebar.PREFIX + spec.name)
        bound = BOUNDS[spec.name]
        assert (widget.min, widget.max) == (bound.low, bound.high), spec.name


def _sidebar_with_a_loaded_config() -> None:
    """A page that loads a config with out-of-range sizes into the widgets, once."""
    import streamlit as st

    from blockviz.core import config
    from blockviz.core.presets import DEFAULT_PRESET
    from blockviz.dashboard import sidebar

    if "loaded" not in st.session_state:
        st.session_state["loaded"] = True
        loaded = config.replace(config.RunConfig(), n_layer=10_000, batch_size=10**9, lr=50.0)
        sidebar.apply_run_config(loaded)
        st.session_state[sidebar.PRESET_KEY] = DEFAULT_PRESET
    sidebar.render_sidebar()


@pytest.mark.timeout(60)
def test_a_loaded_value_out_of_range_goes_to_the_nearest_end() -> None:
    # The browser keeps a typed value within min/max; a value set by code is clamped here
    # before anything reads it (so the count never loops over 10,000 layers).
    at = AppTest.from_function(_sidebar_with_a_loaded_config, default_timeout=TIMEOUT).run()
    assert not at.exception
    for name in ("n_layer", "batch_size", "lr"):
        assert at.number_input(key=sidebar.PREFIX + name).value == BOUNDS[name].high
    assert at.session_state["cfg.n_layer"] == BOUNDS["n_layer"].high
    assert metric_total(at) > 0  # counted for 256 layers, at once


def _sidebar_alone() -> None:
    """Only the sidebar, its state kept for the test (no pages, so no navigation quirks)."""
    import streamlit as st

    from blockviz.dashboard import sidebar

    st.session_state["test.state"] = sidebar.render_sidebar()


@pytest.fixture
def bare_sidebar() -> AppTest:
    return AppTest.from_function(_sidebar_alone, default_timeout=TIMEOUT).run()


def sidebar_texts(at: AppTest) -> list[str]:
    """The Markdown bodies of every text element in the sidebar."""
    side = at.sidebar
    elements = [*side.markdown, *side.caption, *side.error, *side.warning, *side.info]
    return [element.value for element in elements]


@pytest.mark.parametrize(
    "data",
    [
        "".join(f"line {i}: the quick brown fox\n" for i in range(200)).encode(),
        b"\x00 binary",
        b"short text",
    ],
    ids=["accepted", "refused", "too-short"],
)
def test_an_upload_name_is_shown_as_text_not_markdown(bare_sidebar: AppTest, data: bytes) -> None:
    at = bare_sidebar
    name = "![t](http://127.0.0.1:9/pixel.png).txt"
    at.selectbox(key="cfg.dataset").set_value(config_fields.UPLOAD_CHOICE).run()
    at.file_uploader(key=uploads.UPLOAD_KEY).set_value((name, data, "text/plain")).run()
    assert not at.exception
    quoting = [text for text in sidebar_texts(at) if "pixel" in text]
    assert quoting  # the name is shown...
    for text in quoting:  # ...with every Markdown character escaped
        assert "![" not in text and "](" not in text
        assert "\\!\\[t\\]\\(http" in text


def test_an_upload_name_with_a_bare_url_is_not_a_link(bare_sidebar: AppTest) -> None:
    at = bare_sidebar
    name = "www.example.org notes from https://example.com, ask me@example.com.txt"
    data = "".join(f"line {i}: the quick brown fox\n" for i in range(200)).encode()
    at.selectbox(key="cfg.dataset").set_value(config_fields.UPLOAD_CHOICE).run()
    at.file_uploader(key=uploads.UPLOAD_KEY).set_value((name, data, "text/plain")).run()
    assert not at.exception
    (using,) = [text for text in sidebar_texts(at) if text.startswith("Using ")]
    assert autolinks(using) == [], using
    assert name in shown(using)  # read as typed


def test_a_bare_number_run_name_blocks_launch_with_the_reason(bare_sidebar: AppTest) -> None:
    at = bare_sidebar
    at.text_input(key=sidebar.NAME_KEY).set_value("2").run()
    assert not at.exception
    state = at.session_state["test.state"]
    assert not state.can_launch and "bare number" in state.problem
    (shown,) = [e.value for e in at.sidebar.error if "bare number" in e.value]
    assert "run\\-2" in shown  # the fix it suggests, escaped as plain text
    at.text_input(key=sidebar.NAME_KEY).set_value("run-2").run()
    state = at.session_state["test.state"]
    assert state.can_launch and state.name == "run-2"
    assert not any("bare number" in e.value for e in at.sidebar.error)


def test_every_built_in_dataset_is_offered_with_a_note() -> None:
    from blockviz.core.corpora import BUILTIN
    from blockviz.dashboard.config_fields import DATASET_CHOICES, DATASET_NOTES

    assert set(BUILTIN) < set(DATASET_CHOICES)
    assert set(DATASET_CHOICES) == set(DATASET_NOTES)


def test_tensorboard_logging_without_the_package_is_refused_before_launch(
    bare_sidebar: AppTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run` does not install tensorboard: the sidebar says so under the field."""
    import importlib.util

    real = importlib.util.find_spec
    hidden = {"tensorboard", "tensorboardX"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a)
    )
    at = bare_sidebar
    at.selectbox(key="cfg.logger").set_value("tensorboard").run()
    state = at.session_state["test.state"]
    assert not state.can_launch
    assert "pip install tensorboard" in state.problem
    at.selectbox(key="cfg.logger").set_value("csv").run()
    assert at.session_state["test.state"].can_launch


# ------------------------------------------------------------------ issue 13


def qp(at: AppTest) -> dict[str, str]:
    """The app's URL query, one value per key."""
    return {k: v[-1] if isinstance(v, list) else v for k, v in at.query_params.items()}


def sidebar_metric(at: AppTest) -> str:
    (metric,) = [m for m in at.sidebar.metric if m.label == "Parameters"]
    return metric.value


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cfg.d_model": 130, "cfg.n_head": 4}, "n_head"),
        ({"cfg.attention": False, "cfg.ffn": False}, "ffn"),
    ],
    ids=["heads-do-not-divide", "empty-block"],
)
def test_an_invalid_config_shows_its_message_not_a_diagram_or_a_count(
    app: AppTest, changes: dict, field: str
) -> None:
    assert app.get("graphviz_chart") and sidebar_metric(app) != "—"
    for key, value in changes.items():
        widget = app.toggle(key=key) if isinstance(value, bool) else app.number_input(key=key)
        widget.set_value(value).run()
    assert not app.exception
    assert sidebar_metric(app) == "—"
    main_errors = [e.value.replace("\\", "") for e in app.main.error]  # ui.plain's escapes
    assert any("does not validate" in e and f"{field}:" in e for e in main_errors)
    assert not app.get("graphviz_chart")
    assert not [m for m in app.main.metric if m.label in ("Total", "FFN / block")]
    app.switch_page("pages/parameters.py").run()
    assert any("does not validate" in e.value for e in app.main.error)
    assert not app.main.metric and not app.main.dataframe


def test_without_an_upload_yet_the_diagram_and_count_stay(app: AppTest) -> None:
    app.selectbox(key="cfg.dataset").set_value(config_fields.UPLOAD_CHOICE).run()
    assert launch_disabled(app)  # the data is missing, the model is fine
    assert app.get("graphviz_chart") and sidebar_metric(app) != "—"
    assert [m for m in app.main.metric if m.label == "Total"]


def test_norm_type_is_greyed_out_and_left_out_of_the_name_without_norms(app: AppTest) -> None:
    app.selectbox(key="cfg.norm_type").set_value("rmsnorm").run()
    assert not app.selectbox(key="cfg.norm_type").disabled
    assert app.text_input(key=sidebar.NAME_KEY).value == "rmsnorm"
    app.selectbox(key="cfg.norm_position").set_value("none").run()
    norm_type = app.selectbox(key="cfg.norm_type")
    assert norm_type.disabled and "norm position is none" in norm_type.help
    assert app.selectbox(key="cfg.final_norm").disabled
    assert app.text_input(key=sidebar.NAME_KEY).value == "no-norm"
    app.selectbox(key="cfg.norm_position").set_value("post").run()
    assert not app.selectbox(key="cfg.norm_type").disabled
    assert app.selectbox(key="cfg.norm_type").value == "rmsnorm"  # kept while greyed out


def test_qk_norm_keeps_norm_type_live_without_norms_and_greys_out_without_attention(
    app: AppTest,
) -> None:
    app.selectbox(key="cfg.norm_position").set_value("none").run()
    assert app.selectbox(key="cfg.norm_type").disabled
    app.toggle(key="cfg.qk_norm").set_value(True).run()
    # q_norm and k_norm are then the model's only norms, and norm_type picks their kind
    assert not app.selectbox(key="cfg.norm_type").disabled
    assert app.text_input(key=sidebar.NAME_KEY).value == "no-norm-qknorm"
    total = metric_total(app)
    app.selectbox(key="cfg.norm_type").set_value("rmsnorm").run()
    assert metric_total(app) < total  # RMSNorm drops the q/k norms' biases
    app.toggle(key="cfg.attention").set_value(False).run()
    qk_norm = app.toggle(key="cfg.qk_norm")
    assert qk_norm.disabled and "attention is off" in qk_norm.help
    assert app.selectbox(key="cfg.norm_type").disabled


def test_the_preset_caption_says_what_differs_from_the_preset(app: AppTest) -> None:
    preset = config.preset(DEFAULT_PRESET)

    def captions() -> str:
        return "\n".join(c.value for c in app.sidebar.caption)

    assert "Changed" not in captions()
    app.number_input(key="cfg.d_model").set_value(64).run()
    assert f"d\\_model 64 \\(preset {preset.model.d_model}\\)" in captions()
    app.number_input(key="cfg.d_model").set_value(preset.model.d_model).run()
    assert "Changed" not in captions()


def through_app(at: AppTest, page: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    """Switch pages as the server does: through app.py's navigation.

    AppTest runs a switched-to page file alone, after the first rerun through app.py
    (streamlit_compat); a server always runs app.py. Allowing that rerun again makes
    this switch go through app.py, as it does in the browser.
    """
    monkeypatch.setattr(streamlit_compat, "_rerouted", False)
    return at.switch_page(page).run()


def test_config_is_drawn_only_where_it_drives_and_kept_across_pages(
    app: AppTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.number_input(key="cfg.n_layer").set_value(6).run()
    app.selectbox(key="cfg.norm_position").set_value("post").run()
    app.text_input(key=sidebar.NAME_KEY).set_value("my run").run()
    kept: list[bool] = []
    keep = sidebar.keep_values
    monkeypatch.setattr(sidebar, "keep_values", lambda: kept.append(True) or keep())
    for page in ("pages/live.py", "pages/compare.py", "pages/runs.py"):
        through_app(app, page, monkeypatch)
        assert kept, page  # app.py ran, and kept the values
        assert not app.exception, page
        assert not app.sidebar.number_input and not app.sidebar.selectbox, page
        assert not set(qp(app)) & set(url_config.PARAMS), page  # no config in its URL
    through_app(app, "pages/train.py", monkeypatch)
    assert app.number_input(key="cfg.n_layer").value == 6
    assert app.selectbox(key="cfg.norm_position").value == "post"
    assert app.text_input(key=sidebar.NAME_KEY).value == "my run"
    assert qp(app)["n_layer"] == "6"  # Train writes the session's config back


def test_a_shared_url_opens_the_same_config() -> None:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"preset": "tiny", "norm_position": "post", "lr": "0.003"})
    at.query_params.update({"dataset": "ops", "final_norm": "true"})
    at.run()
    assert not at.exception and not at.warning
    assert at.selectbox(key="cfg.preset").value == "tiny"
    assert at.selectbox(key="cfg.norm_position").value == "post"
    assert at.number_input(key="cfg.lr").value == 0.003
    assert at.selectbox(key="cfg.dataset").value == "ops"
    assert at.selectbox(key="cfg.final_norm").value == "on"
    tiny = config.preset("tiny")
    assert at.number_input(key="cfg.n_layer").value == tiny.model.n_layer  # from the preset
    # A change is written back: the preset plus what differs from it, nothing else.
    at.number_input(key="cfg.n_layer").set_value(tiny.model.n_layer + 1).run()
    expected = {"preset": "tiny", "norm_position": "post", "lr": "0.003", "dataset": "ops"}
    expected |= {"final_norm": "true", "n_layer": str(tiny.model.n_layer + 1)}
    assert qp(at) == expected
    at.number_input(key="cfg.lr").set_value(tiny.train.lr).run()
    assert "lr" not in qp(at)


def test_a_typed_name_travels_in_the_url_a_suggested_one_does_not(app: AppTest) -> None:
    app.selectbox(key="cfg.norm_position").set_value("post").run()
    assert qp(app) == {"preset": DEFAULT_PRESET, "norm_position": "post"}
    app.text_input(key=sidebar.NAME_KEY).set_value("baseline post").run()
    assert qp(app)["name"] == "baseline post"
    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
    fresh.query_params.update(qp(app))
    fresh.run()
    assert fresh.text_input(key=sidebar.NAME_KEY).value == "baseline post"


@pytest.mark.parametrize(
    ("key", "text", "says"),
    [
        ("n_layer", "many", "must be an integer in [1, 256]"),
        ("norm_position", "middle", "choose one of pre, post, none"),
        ("colour", "blue", "not a config field"),
        ("preset", "huge", "choose one of"),
    ],
)
def test_a_bad_url_value_is_a_warning_naming_it(key: str, text: str, says: str) -> None:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"d_model": "64", key: text})
    at.run()
    assert not at.exception
    (warning,) = [w.value for w in at.sidebar.warning if "From the link" in w.value]
    plain_text = warning.replace("\\", "")
    assert key in plain_text and says in plain_text
    assert at.number_input(key="cfg.d_model").value == 64  # the good key still applies
    preset = config.preset(DEFAULT_PRESET)
    assert at.number_input(key="cfg.n_layer").value == preset.model.n_layer
    assert at.selectbox(key="cfg.norm_position").value == preset.model.norm_position
    at.number_input(key="cfg.d_model").set_value(96).run()  # the user moves on
    assert not [w for w in at.sidebar.warning if "From the link" in w.value]


def test_an_upload_says_it_cannot_travel_in_the_url(app: AppTest) -> None:
    app.selectbox(key="cfg.dataset").set_value(config_fields.UPLOAD_CHOICE).run()
    assert any("cannot travel in a URL" in c.value for c in app.sidebar.caption)
    assert "dataset" not in qp(app)


def _load_then_sidebar() -> None:
    """A page that loads a run's config into a fresh session, then draws the sidebar."""
    import streamlit as st

    from blockviz.core import config
    from blockviz.dashboard import sidebar

    if "loaded" not in st.session_state:
        st.session_state["loaded"] = True
        sidebar.apply_run_config(config.replace(config.RunConfig(), n_layer=3))
    sidebar.render_sidebar()


def test_a_config_loaded_before_the_first_sidebar_is_not_replaced_by_the_url() -> None:
    at = AppTest.from_function(_load_then_sidebar, default_timeout=TIMEOUT)
    at.query_params["n_layer"] = "5"
    at.run()
    assert not at.exception
    assert at.number_input(key="cfg.n_layer").value == 3
    assert qp(at)["n_layer"] == "3"
