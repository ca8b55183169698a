"""`membench` command line: subcommands dispatch to Hydra apps over `conf/`.

    membench run [overrides...]        one run (or a sweep with -m) under torchrun
    python -m bench run ...            the same

Exit status is the run's status code (bench.exit_codes); a sweep exits with its most severe one.
"""
from __future__ import annotations

import secrets
import sys
from datetime import datetime
from pathlib import Path
from typing import List, Optional

from bench.exit_codes import EXIT_INTERRUPTED, EXIT_INVALID, STATUS_EXIT_CODE, worst_status

USAGE = """usage: membench <command> [hydra overrides...]

commands:
  run        launch a workload under torchrun and record memory per rank (Hydra app; -m for a sweep)
  plan       estimate per-rank memory for any world size (no GPU, tables never materialized)
  provision  recommend the smallest world size that fits with headroom (and per batch size)
  calibrate  fit the peak predictor from measured runs (results/calibration/<hardware>.json)
  report     figures + report.md from runs, sweeps or a results directory
  compare    the regression table between two runs (or two sweeps, point by point); exit 1 if they differ

examples:
  membench run                                      # tiny workload, hardware=auto (CPU: 2 ranks)
  membench run workload=small sharding=column_wise
  membench run -m workload.batch_size=256,1024 workload.num_tables=4,16
  membench run --help                               # config groups and every option
  membench plan workload=tb_10 hardware=h100_80g world_size=512
  membench provision workload=tb_1 hardware=h100_80g plan.headroom=0.1
  membench report results/runs/sweep-<id> --out report/
  membench compare results/runs/<run A> results/runs/<run B> --rtol 0.01

exit status: 0 ok, 1 failed, 2 invalid config, 3 out of memory, 4 timeout, 130 interrupted
"""
COMMANDS = ("run", "plan", "provision", "calibrate", "report", "compare")
# Hydra apps: module and function
HYDRA_COMMANDS = {"run": ("bench.run_app", "main"), "plan": ("bench.plan_app", "plan_main"),
                  "provision": ("bench.plan_app", "provision_main")}
# subcommands with their own argparse interface (the rest are Hydra apps)
ARGPARSE_COMMANDS = {"calibrate": "bench.calibrate", "report": "bench.report", "compare": "bench.compare_app"}


def new_run_id() -> str:
    """Sortable and unique even for runs started in the same second by concurrent processes."""
    return f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


# Sweep directories this process resolved: with a launcher that runs points in other processes
# (submitit), the exit status is read back from their sweep.json.
SWEEP_DIRS: List[Path] = []


def sweep_dir(results_dir: str) -> str:
    path = f"{results_dir}/sweep-{new_run_id()}"
    SWEEP_DIRS.append(Path(path))
    return path


def register_resolvers() -> None:
    from omegaconf import OmegaConf

    # use_cache: one value per process, so a sweep's directory is resolved once for all its jobs
    OmegaConf.register_new_resolver("membench_id", new_run_id, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("membench_sweep_dir", sweep_dir, use_cache=True, replace=True)


def statuses_from_sweeps() -> List[str]:
    import json

    statuses = []
    for path in SWEEP_DIRS:
        index = path / "sweep.json"
        if index.exists():
            statuses.extend(run["status"] for run in json.loads(index.read_text()).get("runs", []))
    return statuses


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if argv else EXIT_INVALID)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"membench: unknown command {command!r}; use one of {', '.join(COMMANDS)}\n\n{USAGE}",
              file=sys.stderr)
        sys.exit(EXIT_INVALID)
    if command in ARGPARSE_COMMANDS:
        import importlib

        sys.exit(importlib.import_module(ARGPARSE_COMMANDS[command]).main(rest))
    import importlib

    from bench import run_app
    from bench.config import register_configs

    register_configs()
    register_resolvers()
    sys.argv = [f"membench {command}", *rest]
    module, function = HYDRA_COMMANDS[command]
    try:
        getattr(importlib.import_module(module), function)()
    except SystemExit as exc:
        # Hydra exits 1 on a bad override or unknown key, before our app runs: that is `invalid`.
        if exc.code not in (0, None) and not run_app.STATUSES:
            sys.exit(EXIT_INVALID)
        raise
    except KeyboardInterrupt:
        print("membench: interrupted; the running torchrun was stopped, finished runs are kept", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if run_app.STATUSES:
        if len(run_app.STATUSES) > 1:
            run_app.print_sweep_table()
        sys.exit(STATUS_EXIT_CODE[worst_status(status for _, status, _ in run_app.STATUSES)])
    statuses = statuses_from_sweeps()  # points that ran in other processes
    if statuses:
        sys.exit(STATUS_EXIT_CODE[worst_status(statuses)])


if __name__ == "__main__":
    main()
