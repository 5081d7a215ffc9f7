"""The Live page's parts: its state and session keys, the header and findings, the tabs."""
