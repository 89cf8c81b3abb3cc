"""Launching: the layout planner, the memory model, the cluster projection and nemo-run submission."""
