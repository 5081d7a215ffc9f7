"""The Streamlit side: the only code that imports streamlit."""
