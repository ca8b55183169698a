"""Per-rank memory recorders: one Recorder base; exact CPU accounting and CUDA allocator/NVML backends."""
