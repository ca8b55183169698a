"""Run results: the schema (records, statuses, exit codes), the store (files on disk), the environment."""
# TEMPORARY (until bench/report moves to the new import paths): the names bench/report imports
from bench.results.schema import CATEGORIES, JobStats, RankResult, RunSummary, job_stats  # noqa: F401,E402
from bench.results.store import ResultsError, atomic_write_text, load_summary, write_summary  # noqa: F401,E402
