"""blockviz: train small character-level transformers and see what the block does."""

__version__ = "0.1.0"

# How a hint tells a reader to type a command: the .venv that `make run` makes (README).
CLI = ".venv/bin/python -m blockviz"
