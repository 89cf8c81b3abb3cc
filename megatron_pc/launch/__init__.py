"""Launching: the layout planner, the models table and nemo-run submission."""
