"""Validating the CUDA path on a GPU in one call (and the same flow on CPU, against a simulated GPU: --simulate)."""
