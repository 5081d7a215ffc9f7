"""The Studies page's parts: the launcher and a study's live panel."""
