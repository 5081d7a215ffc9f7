"""blockviz: train small character-level transformers and see what the block does."""

__version__ = "0.1.0"
