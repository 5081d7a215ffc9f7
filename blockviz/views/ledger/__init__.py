"""The claim ledger read from a store: `build` (entries from the store's studies and its
imports), `imports` (exports kept beside the store), `text` (`ledger list` and `show`),
`page` (the offline HTML export), `docs_table` (docs/studies.md's generated claims table)."""
