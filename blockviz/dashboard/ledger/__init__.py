"""The Ledger page's parts: `cards` (a card per claim, its chart) and `files` (the HTML and
JSON downloads, the import uploader)."""
