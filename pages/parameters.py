"""Parameters: where the parameters of the sidebar's model sit, without training it."""

import streamlit as st

from blockviz.core import params
from blockviz.dashboard import sidebar, ui
from blockviz.views import charts
from blockviz.views.breakdown import breakdown_frames, share_sentence

state = sidebar.state()
model_cfg = state.model_for_params

st.title("Parameters")
st.caption(
    "The exact parameter count of the model in the sidebar, per component and per layer, "
    "with the formula behind each number. Change a field and it updates."
)

if model_cfg is None:
    sidebar.show_invalid(state, "to count its parameters")  # the message, not a count
    st.stop()

with ui.guard("Parameter breakdown"):
    breakdown = params.param_breakdown(model_cfg)
    by_component, by_layer, rows = breakdown_frames(breakdown, model_cfg.n_layer)
    total_col, blocks_col, vocab_col = st.columns(3)
    total_col.metric("Total parameters", f"{breakdown.total:,}")
    blocks_col.metric("Blocks", model_cfg.n_layer)
    vocab_col.metric(
        "vocab_size",
        model_cfg.vocab_size,
        help="Set from the dataset when a run starts; uploads use their own count here.",
    )
    st.markdown(share_sentence(model_cfg, breakdown))

    component_tab, layer_tab, rows_tab = st.tabs(["By component", "By layer", "Every tensor group"])
    with component_tab:
        st.dataframe(
            by_component.assign(share=by_component["share"] * 100),
            hide_index=True,
            width="stretch",
            column_config={
                "count": st.column_config.NumberColumn("parameters", format="localized"),
                "share": st.column_config.NumberColumn("share", format="%.1f%%"),
                "layers": st.column_config.NumberColumn("layers"),
                "formula": st.column_config.TextColumn("formula (one layer)", width="large"),
            },
        )
        ui.chart_with_downloads(
            charts.param_breakdown_chart(by_component),
            by_component,
            f"parameters-by-component-{state.name}",
            key="params.components",
        )
    with layer_tab:
        per_layer = by_layer.groupby("layer", sort=False, as_index=False)["count"].sum()
        per_layer["share"] = 100 * per_layer["count"] / max(breakdown.total, 1)
        st.dataframe(
            per_layer,
            hide_index=True,
            width="stretch",
            column_config={
                "count": st.column_config.NumberColumn("parameters", format="localized"),
                "share": st.column_config.NumberColumn("share", format="%.1f%%"),
            },
        )
        ui.chart_with_downloads(
            charts.param_layer_chart(by_layer),
            by_layer,
            f"parameters-by-layer-{state.name}",
            key="params.layers",
        )
    with rows_tab:
        st.dataframe(
            rows.drop(columns=["layer_index"]),
            hide_index=True,
            width="stretch",
            column_config={
                "count": st.column_config.NumberColumn("parameters", format="localized"),
                "formula": st.column_config.TextColumn("formula", width="large"),
            },
        )
