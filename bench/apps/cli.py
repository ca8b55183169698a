"""`membench` command line: subcommands dispatch to Hydra apps over `conf/`.

    membench run [overrides...]        one run (or a sweep with -m) under torchrun
    python -m bench run ...            the same

Exit status is the run's status code (bench.results.schema); a sweep exits with its most severe one.
"""
from __future__ import annotations

import importlib
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

from bench.apps.console import print_sweep
from bench.apps.progress import SweepProgress, is_multirun
from bench.apps.run import JobOutcome
from bench.results.schema import EXIT_INTERRUPTED, EXIT_INVALID, exit_code, worst_status
from bench.results.store import sweep_statuses
from bench.run.config import CONF_DIR, register_configs, register_resolvers
from bench.run.quick_exit import skip_final_collection

USAGE = """usage: membench <command> [hydra overrides...]

commands:
  run        launch a workload under torchrun and record memory per rank (Hydra app; -m for a sweep)
  plan       estimate per-rank memory for any world size (no GPU, tables never materialized)
  provision  recommend the smallest world size that fits with headroom (per batch size and UVM cache ratio)
  calibrate  fit the peak predictor from measured runs (results/calibration/<hardware>.json)
  planner-check  torchrec's planner with its memory model and membench's, each plan run at a tight capacity
  reservation  a finished run's measured static base, activation term and overhead as torchrec's reservation
  report     figures + report.md from runs, sweeps or a results directory
  compare    the regression table between two runs (or two sweeps, point by point); exit 1 if they differ
  export     runs as one table (.csv, .jsonl, .parquet): a row per run and rank, config keys as columns
  ls         past runs and sweeps, newest first (--status oom, --workload, --hardware, --mode)

examples:
  membench run                                      # tiny workload, hardware=auto (CPU: 2 ranks)
  membench run workload=small sharding=column_wise
  membench run -m workload.batch_size=256,1024 workload.num_tables=4,16
  membench run hardware=h100_80g hardware.simulate=true    # a GPU preset on CPU: caching allocator modelled
  membench run -m hardware=h100_80g hardware.simulate=true allocator.expandable_segments=false,true
  membench run record.cpu_mode=memtracker           # cross-check: PyTorch's MemTracker counts instead
  membench run --help                               # config groups and every option
  membench plan workload=tb_10 hardware=h100_80g world_size=512
  membench provision workload=tb_1 hardware=h100_80g plan.headroom=0.1
  membench provision workload=tb_10 hardware=h100_80g sharding.compute_kernel=fused_uvm_caching 'plan.caching_ratios=[0.05,0.2]'
  membench reservation results/runs/<run>          # its measured terms as torchrec's storage reservation
  membench report results/runs/sweep-<id> --out report/
  membench compare results/runs/<run A> results/runs/<run B> --rtol 0.01
  membench export results/runs/sweep-<id> --out sweep.csv     # or .jsonl, .parquet; --timelines
  membench ls --status oom

exit status: 0 ok, 1 failed, 2 invalid config, 3 out of memory, 4 timeout, 130 interrupted
"""
COMMANDS = ("run", "plan", "provision", "calibrate", "planner-check", "reservation", "report", "compare", "export",
            "ls")
# Hydra apps: module and the task of one job (returns a JobOutcome)
HYDRA_COMMANDS = {"run": ("bench.apps.run", "run_job"), "plan": ("bench.apps.plan", "plan_job"),
                  "provision": ("bench.apps.plan", "provision_job")}
# subcommands with their own argparse interface (the rest are Hydra apps)
ARGPARSE_COMMANDS = {"calibrate": "bench.apps.calibrate", "planner-check": "bench.apps.planner_check",
                     "reservation": "bench.apps.reservation",
                     "report": "bench.report", "compare": "bench.apps.compare",
                     "export": "bench.apps.export", "ls": "bench.apps.ls"}


def run_hydra_app(command: str, rest: List[str], outcomes: List[JobOutcome]) -> List[str]:
    """Run one Hydra command over conf/, appending to `outcomes` how each job this process ran ended
    (a sweep shows its progress as each point ends). Returns the statuses of the points a launcher ran in
    other processes (submitit), read back from their sweep's index."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    module_name, task_name = HYDRA_COMMANDS[command]
    task = getattr(importlib.import_module(module_name), task_name)
    sweep_dirs: List[Path] = []
    progress = SweepProgress.for_args(rest, CONF_DIR) if is_multirun(rest) else None

    def job(dict_cfg) -> None:
        started = time.monotonic()
        if progress is not None:
            progress.point_started()
        outcome = task(dict_cfg)
        outcome = replace(outcome, overrides=tuple(HydraConfig.get().overrides.task))
        outcomes.append(outcome)
        if progress is not None:
            progress.point_done(outcome.overrides, outcome.status, outcome.peak_bytes, time.monotonic() - started)

    register_configs()
    register_resolvers(on_sweep_dir=sweep_dirs.append)
    sys.argv = [f"membench {command}", *rest]
    try:
        hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")(job)()
    finally:
        if progress is not None:
            progress.stop()
    return [] if outcomes else [status for path in sweep_dirs for status in sweep_statuses(path)]


def main(argv: Optional[List[str]] = None) -> None:
    skip_final_collection()
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
        sys.exit(importlib.import_module(ARGPARSE_COMMANDS[command]).main(rest))
    outcomes: List[JobOutcome] = []
    try:
        remote_statuses = run_hydra_app(command, rest, outcomes)
    except SystemExit as exc:
        # Hydra exits 1 on a bad override or unknown key, before any job runs: that is `invalid`.
        if exc.code not in (0, None) and not outcomes:
            sys.exit(EXIT_INVALID)
        raise
    except KeyboardInterrupt:
        print("membench: interrupted; the running torchrun was stopped, finished runs are kept", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if len(outcomes) > 1:
        print_sweep(outcomes)
    statuses = [outcome.status for outcome in outcomes] or remote_statuses
    if statuses:
        sys.exit(exit_code(worst_status(statuses)))


if __name__ == "__main__":
    main()
