"""Studies: a question about the block, its claims and the runs that answer them
(`define`, `builtins`, `sweeps`); how each run ended (`outcomes`); means, intervals and
comparisons (`stats`, `comparisons`, `summary`); the verdicts (`verdicts`, the rules in
`rules/`). Torch-free."""
