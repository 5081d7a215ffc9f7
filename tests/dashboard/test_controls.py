"""The chart controls Live and Compare share: one row per page, each with its own state."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

TIMEOUT = 30


def _two_pages_of_controls() -> None:
    """Two pages' controls side by side; the metrics on offer come from session state."""
    import streamlit as st

    from blockviz.dashboard.controls import chart_controls

    metrics = st.session_state.get("test.metrics", ["train/grad_norm", "val/bpc", "val/loss"])
    st.session_state["test.live"] = chart_controls(
        "live", metrics, preferred=("train/grad_norm", "val/bpc"), metric_label="Another metric"
    )
    st.session_state["test.compare"] = chart_controls(
        "compare", metrics, preferred=("val/bpc", "train/grad_norm")
    )


def controls_app() -> AppTest:
    return AppTest.from_function(_two_pages_of_controls, default_timeout=TIMEOUT)


def test_defaults_and_each_pages_preferred_metric() -> None:
    at = controls_app().run()
    assert not at.exception
    live, compare = at.session_state["test.live"], at.session_state["test.compare"]
    assert (live.smoothing, live.log_scale, live.metric) == (0.6, False, "train/grad_norm")
    assert (compare.smoothing, compare.log_scale, compare.metric) == (0.6, False, "val/bpc")
    assert at.selectbox(key="live.metric").label == "Another metric"
    assert at.selectbox(key="compare.metric").label == "Metric"


def test_each_page_keeps_its_own_values() -> None:
    at = controls_app().run()
    at.slider(key="live.smoothing").set_value(0.9).run()
    at.toggle(key="compare.log_scale").set_value(True).run()
    at.selectbox(key="live.metric").set_value("val/loss").run()
    live, compare = at.session_state["test.live"], at.session_state["test.compare"]
    assert (live.smoothing, live.log_scale, live.metric) == (0.9, False, "val/loss")
    assert (compare.smoothing, compare.log_scale, compare.metric) == (0.6, True, "val/bpc")


def test_a_metric_no_longer_on_offer_falls_back_to_the_preferred_one() -> None:
    at = controls_app().run()
    at.selectbox(key="live.metric").set_value("val/loss").run()
    at.session_state["test.metrics"] = ["val/bpc", "train/tokens_per_sec"]
    at.run()
    assert at.session_state["test.live"].metric == "val/bpc"
    at.session_state["test.metrics"] = ["train/tokens_per_sec"]
    at.run()
    assert at.session_state["test.live"].metric == "train/tokens_per_sec"  # the first one


def test_no_metrics_means_no_picker() -> None:
    at = controls_app()
    at.session_state["test.metrics"] = []
    at.run()
    assert not at.exception
    assert at.session_state["test.live"].metric is None
    assert not at.selectbox
    assert at.slider(key="live.smoothing").value == 0.6


def test_a_value_the_page_set_beforehand_is_kept() -> None:
    # Live re-assigns its preferences each refresh so closed tabs keep them.
    at = controls_app()
    at.session_state["live.smoothing"] = 0.25
    at.session_state["live.log_scale"] = True
    at.run()
    assert not at.exception
    live = at.session_state["test.live"]
    assert (live.smoothing, live.log_scale) == (0.25, True)
