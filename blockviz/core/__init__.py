"""The torch-free core: configuration, the vocabulary, parameter counts, naming."""
