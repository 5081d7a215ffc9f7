"""blockviz: the Streamlit entry point (`make run`).

Navigation between the pages, and the shared sidebar drawn once per run before the page,
so every page sees the same config. No torch here or in any page: training runs in its own
process (blockviz.runner).
"""

import streamlit as st

from blockviz.dashboard import sidebar

st.set_page_config(page_title="blockviz", layout="wide")

navigation = st.navigation(
    [
        st.Page("pages/train.py", title="Train", icon=":material/model_training:", default=True),
        st.Page("pages/live.py", title="Live", icon=":material/monitoring:"),
        st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:"),
        st.Page("pages/parameters.py", title="Parameters", icon=":material/functions:"),
        st.Page(
            "pages/init_grads.py", title="Gradients at init", icon=":material/stacked_line_chart:"
        ),
        st.Page("pages/runs.py", title="Runs", icon=":material/list:"),
    ]
)
st.session_state[sidebar.STATE_KEY] = sidebar.render_sidebar()
try:
    navigation.run()
finally:
    # A page run on its own (or a fragment rerun) must not pick up a stale state.
    st.session_state.pop(sidebar.STATE_KEY, None)
