"""Launching a run: typed config, launch spec, torchrun launcher, per-rank worker, model backends, recorders."""
