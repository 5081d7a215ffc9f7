"""Gradients at init: the sidebar's model, Pre-LN vs Post-LN by depth and init, no training."""

import pandas as pd
import streamlit as st

from blockviz.core.config_model import INITS
from blockviz.dashboard import init_grads, sidebar, ui
from blockviz.views import charts

DEPTH_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)

state = sidebar.state()
run_config = state.run_config

st.title("Gradients at init")
st.caption(
    "For the sidebar's model, without training: one batch of its dataset, one backward pass, "
    "and the L2 norm of each block's FFN output weight gradient (`ffn.fc_out.weight`), for "
    "Pre-LN and Post-LN at several depths and each init, averaged over seeds. Pre and Post "
    "share the seed and so every weight; the sidebar's n_layer, norm position and init are "
    "replaced by each variant, dropout is off. Computed by `python -m blockviz init-grads` in "
    "its own process."
)
st.markdown(init_grads.PAPER_CLAIM)

if run_config is None:
    st.info("Fix the config in the sidebar (see the message there) to measure its gradients.")
    st.stop()
if not run_config.model.ffn:
    st.info("This page measures the FFN output weight; turn ffn on in the sidebar.")
    st.stop()

depth_col, init_col, seed_col = st.columns([2, 2, 1])
# A few seconds by default (measured: 8 s on a quiet 2-core CPU); add depths, inits, seeds.
depths = depth_col.multiselect("Depths (n_layer)", DEPTH_CHOICES, default=[3, 6, 12])
inits = init_col.multiselect("Inits", INITS, default=["xavier"])
n_seeds = seed_col.number_input("Seeds", min_value=1, max_value=10, value=2, step=1)

if not depths or not inits:
    st.info("Choose at least one depth and one init.")
    st.stop()

key = init_grads.cache_key(run_config, depths, inits, int(n_seeds))
result = init_grads.cached(key)
if result is None:
    n_models = int(n_seeds) * len(inits) * len(depths) * 2
    st.caption(f"{n_models} models to build, one forward and backward pass each.")
    if not st.button("Measure", type="primary"):
        st.stop()
    bar = st.progress(0.0, text="starting the measurement process…")

    def _progress(done: int, total: int, what: str) -> None:
        bar.progress(done / max(total, 1), text=f"{done}/{total}: {what}")

    try:
        result = init_grads.measure(run_config, depths, inits, int(n_seeds), _progress)
    except init_grads.InitGradsError as exc:
        bar.empty()
        st.error(f"The measurement failed: {exc}")
        st.stop()
    bar.empty()

with ui.guard("Gradients at init"):
    rows, summary = pd.DataFrame(result["rows"]), pd.DataFrame(result["summary"])
    st.caption(
        f"Measured on {ui.plain(result['dataset'])}, batch {result['batch_size']} × "
        f"{result['block_size']} characters, seeds {', '.join(map(str, result['seeds']))}, "
        f"in {result['seconds']:.1f} s."
    )
    for sentence in init_grads.ratio_sentences(result):
        st.markdown(sentence)
    ui.chart_with_downloads(
        charts.init_grad_ratio_chart(summary),
        summary,
        f"init-grads-ratio-{state.name}",
        key="init_grads.ratio",
    )
    ui.chart_with_downloads(
        charts.init_grad_profile_chart(rows),
        charts.init_grad_means(rows),
        f"init-grads-by-block-{state.name}",
        key="init_grads.profile",
    )
    with st.expander("The numbers"):
        st.dataframe(summary, hide_index=True, width="stretch")
