"""Lab checks, written once: the notebooks' test cells and `pytest labs/` call the same functions."""
