"""blockviz: the Streamlit entry point (`make run`)."""

import streamlit as st

st.set_page_config(page_title="blockviz", layout="wide")
st.title("blockviz")
st.write("A training dashboard for the transformer block.")
