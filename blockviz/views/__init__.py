"""Views of runs: Altair charts, the block diagram, export (torch-free)."""
