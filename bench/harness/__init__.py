"""The memory regression gate: pytest plugin, its settings, suites and baselines."""
