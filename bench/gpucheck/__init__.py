"""Validating the CUDA path on a GPU in one call (and the same flow on CPU, with fakes: the dry run)."""
