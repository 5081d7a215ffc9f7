"""blockviz: the Streamlit entry point (`make run`).

Navigation between the pages, and the config sidebar, drawn once per run before the page on
the pages it drives (Train, Playground, Parameters, Gradients at init), so they see the same
config; on the Playground the page draws its quick fields itself, beside its chart, and
a session's config starts from the Playground's own preset (`sidebar.render_sidebar`).
The other pages draw no config; their runs keep its values (`sidebar.keep_values`) and
leave the URL's config keys out. No torch here or in any page: training runs in its own
process (blockviz.launch.runner).
"""

import streamlit as st

from blockviz.core.presets import PLAYGROUND_PRESET
from blockviz.dashboard import sidebar
from blockviz.dashboard.config_fields import QUICK_FIELDS

st.set_page_config(page_title="blockviz", layout="wide")

train = st.Page("pages/train.py", title="Train", icon=":material/model_training:", default=True)
parameters = st.Page("pages/parameters.py", title="Parameters", icon=":material/functions:")
init_grads = st.Page(
    "pages/init_grads.py", title="Gradients at init", icon=":material/stacked_line_chart:"
)
playground_page = st.Page("pages/playground.py", title="Playground", icon=":material/toggle_on:")
navigation = st.navigation(
    [
        train,
        playground_page,
        st.Page("pages/live.py", title="Live", icon=":material/monitoring:"),
        st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:"),
        parameters,
        init_grads,
        st.Page("pages/runs.py", title="Runs", icon=":material/list:"),
        st.Page("pages/studies.py", title="Studies", icon=":material/science:"),
        st.Page("pages/ledger.py", title="Ledger", icon=":material/fact_check:"),
    ]
)
if navigation is playground_page:  # the quick fields are beside its chart instead
    st.session_state[sidebar.STATE_KEY] = sidebar.render_sidebar(QUICK_FIELDS, PLAYGROUND_PRESET)
elif navigation in (train, parameters, init_grads):  # the pages the config drives
    st.session_state[sidebar.STATE_KEY] = sidebar.render_sidebar()
else:
    sidebar.keep_values()
    sidebar.drop_query()
try:
    navigation.run()
finally:
    # A page run on its own (or a fragment rerun) must not pick up a stale state.
    st.session_state.pop(sidebar.STATE_KEY, None)
