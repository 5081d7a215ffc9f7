"""Launching: training runs and study workers as processes (torch-free)."""
