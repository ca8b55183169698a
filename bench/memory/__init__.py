"""Per-rank memory recording: CUDA allocator stats, NVML sampling, OOM capture, snapshots."""
