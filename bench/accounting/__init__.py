"""Exact live-tensor accounting and OOM events: shared by the run recorders and the dry-run estimator."""
