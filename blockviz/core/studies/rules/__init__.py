"""The verdict rules (`studies.verdicts` lists them): the `Verdict` and the group helpers
every rule uses (`base`), loss comparisons (`loss`), counts (`counts`), sweeps (`sweep`)."""
