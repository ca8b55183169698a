"""Process exit codes and run statuses: one table so the launcher, CLI and docs agree."""
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_OOM = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

STATUS_EXIT_CODE = {"ok": EXIT_OK, "failed": EXIT_FAILED, "invalid": EXIT_INVALID, "oom": EXIT_OOM,
                    "timeout": EXIT_TIMEOUT}
# When a sweep mixes outcomes, the process exits with the most severe one.
SEVERITY = ("ok", "oom", "timeout", "failed", "invalid")


def worst_status(statuses) -> str:
    statuses = list(statuses)
    return max(statuses, key=SEVERITY.index) if statuses else "ok"
