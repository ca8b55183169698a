"""`membench`'s CUDA path validated in one call on a GPU host (scripts/gpu_check.sh runs this).

    python -m bench.apps.gpu_check --out DIR            # on a machine with a CUDA GPU
    python -m bench.apps.gpu_check --simulate --out DIR # anywhere: the same flow on a simulated GPU on CPU

Checks, one PASS / FAIL / SKIP line each, all written to DIR/gpu_check.json: an allocation trace replayed
through torch.cuda and through membench's caching allocator model (peak reserved and inactive-split within
2%), twelve short allocator sequences whose statistics were derived by hand from the C++ source (torch.cuda
must give them exactly, in a child process with a fresh allocator), the real APIs membench reads
(memory_stats keys, peak reset, allocator backend, NVML v2 and per-process memory, NVML index of each
torch device), the CUDA recorder on a small model (peaks, NVML, breakdown, snapshot, overhead, a forced OOM), then `membench run` itself: the native backend on one GPU (timeline,
snapshot), a forced OOM, a stalled rank the watchdog must end without leaving a process, and the torchrec
backend with membench's prediction beside the measurement (SKIP when fbgemm-gpu does not import). Exit status:
0 no FAIL, 1 a FAIL, 2 no GPU here (one line).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from bench.gpucheck.log import CheckLog, one_line

EXIT_NO_GPU = 2
# run by scripts/gpu_check.sh under `timeout 480`: the checks skip what would not fit before that
BUDGET_S = 420


def run_all(simulate: bool, out_dir: Path, steps: int, width: int, batch: int, log: CheckLog) -> None:
    from bench.gpucheck.probes import api_probes
    from bench.gpucheck.recorder_checks import recorder_checks, target_for
    from bench.gpucheck.replay import allocator_replay
    from bench.gpucheck.sequences import allocator_sequences
    from bench.gpucheck.runs import native_run, oom_drill, torchrec_run, watchdog_drill

    target = target_for(simulate, log)
    if target is None:
        return
    stages: List[Tuple[str, Callable[[], None]]] = [
        # first: the replay needs an allocator nothing else has used yet
        ("allocator replay", lambda: allocator_replay(target, out_dir, width, batch, log)),
        ("allocator sequences", lambda: allocator_sequences(simulate, out_dir, log)),
        ("API probes", lambda: (log.skip("API probes", "simulated: no CUDA or NVML to ask") if simulate
                                else api_probes(target.device, log))),
        ("recorder checks", lambda: recorder_checks(target, out_dir, steps, width, batch, log)),
        ("native run", lambda: native_run(simulate, out_dir, log)),
        ("OOM drill", lambda: oom_drill(simulate, out_dir, log)),
        ("watchdog drill", lambda: watchdog_drill(simulate, out_dir, log)),
        ("torchrec run", lambda: torchrec_run(simulate, out_dir, log)),
    ]
    started = time.monotonic()
    for name, stage in stages:
        if time.monotonic() - started > BUDGET_S:
            log.skip(f"stage {name}", f"time budget of {BUDGET_S} s spent")
            continue
        try:
            stage()
        except Exception as err:  # noqa: BLE001 (one stage's failure is its FAIL line; the next stages run)
            log.check(f"stage {name}", False, f"stopped: {one_line(err)}")


def cuda_available() -> Optional[str]:
    """None when torch sees a GPU, else why not (one line)."""
    import torch

    if torch.cuda.is_available():
        return None
    return (f"gpu check: no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
            f"run it on a GPU host, or --simulate for the same flow on CPU")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--simulate", "--dry-run", dest="simulate", action="store_true",
                        help="run on CPU against a simulated GPU (the caching allocator model, hardware.simulate)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to keep gpu_check.json, timelines, results and snapshots (default: a temp dir)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4096)
    args = parser.parse_args(argv)
    if not args.simulate:
        problem = cuda_available()
        if problem:
            print(problem, file=sys.stderr)
            return EXIT_NO_GPU
    with tempfile.TemporaryDirectory(prefix="membench-gpu-check-") as tmp:
        out_dir = args.out or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        # written after every check: a check run that is killed keeps what it had found
        log = CheckLog(json_path=out_dir / "gpu_check.json", simulated=args.simulate)
        log.write()
        run_all(args.simulate, out_dir, args.steps, args.width, args.batch, log)
    failed = log.failed
    print(f"gpu check{' (simulated)' if args.simulate else ''}: {log.count('PASS')} passed, {len(failed)} failed, "
          f"{log.count('SKIP')} skipped" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
