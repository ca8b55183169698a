"""torchrun's agent as membench starts it, ending without the interpreter's final collection
(bench.run.quick_exit: half a second of every run).

`python -m bench.run.agent ARGS` is `python -m torch.distributed.run ARGS`: the same arguments, behaviour
and exit status, each rank a fresh interpreter (`python -u -m bench.run.worker --run-dir DIR`).

`python -m bench.run.agent --fork-ranks ARGS -m bench.run.worker --run-dir DIR` (runs on CPU and on the
simulated GPU): the agent imports what a rank imports, once, and torchrun forks each rank from it (its
function entrypoint, start method `fork`; bench.run.forked_rank) instead of starting an interpreter per
rank. The imports are most of a small run's CPU time (torch, torchrec, fbgemm and dynamo: 3-5 s per rank
here), so a node pays them once instead of once per rank. A forked rank runs the same `bench.run.worker.main`, under the same
environment, rendezvous, exit codes and error files; its command line is the agent's (which names the
worker and the run directory, so bench.run.reaper finds it as before). Never on CUDA: a child cannot use
a CUDA context made before the fork, and the CUDA path keeps one fresh process per rank.
"""
from __future__ import annotations

import gc
import importlib
import runpy
import sys
import uuid
from typing import List

from bench.run.quick_exit import skip_final_collection

FORK_RANKS_FLAG = "--fork-ranks"


def preload_rank_imports(worker_args: List[str]) -> None:
    """Import what a rank of this run will import (bench.run.worker, its backend's modules)."""
    from bench.run import worker
    from bench.run.backends import make_backend

    cfg, _ = worker.load_run_config(worker.parse_args(worker_args).run_dir)
    for module in make_backend(cfg.model.backend).imports:
        importlib.import_module(module)
    # torch imports dynamo at the first call of a function it keeps dynamo from tracing (nn.EmbeddingBag's
    # reset_parameters, every optimizer's step): 1.9 s of each rank's start, paid here once
    importlib.import_module("torch._dynamo")


def worker_args(agent_args: List[str]) -> List[str]:
    """The worker's own arguments (`--run-dir DIR`) in torchrun's: what follows `-m bench.run.worker`."""
    from torch.distributed.run import parse_args

    return parse_args(agent_args).training_script_args


def fork_ranks(argv: List[str]) -> None:
    """torch.distributed.run's run(), with bench.run.worker.main forked as a function instead of a command."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    from bench.run.forked_rank import forked_rank
    from bench.run.reaper import WORKER_MODULE

    args = parse_args(argv)
    if not (args.module and args.training_script == WORKER_MODULE):
        raise SystemExit(f"bench.run.agent {FORK_RANKS_FLAG}: forks only `-m {WORKER_MODULE}`, "
                         f"not {args.training_script!r}")
    if args.standalone:  # as torch.distributed.run.run: rendezvous on a free local port
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    args.start_method = "fork"
    config, _, _ = config_from_args(args)
    preload_rank_imports(args.training_script_args)
    # what is imported lives as long as the ranks: out of the collector's reach, a rank's full collections
    # neither walk it nor copy its pages (copy-on-write) by writing its collector headers
    gc.freeze()
    elastic_launch(config=config, entrypoint=forked_rank)(*args.training_script_args)


def main(argv: List[str]) -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    record(fork_ranks)(argv)  # as torchrun's main: a failed rank's error file becomes the root cause


if __name__ == "__main__":
    skip_final_collection()
    if sys.argv[1:2] == [FORK_RANKS_FLAG]:
        main(sys.argv[2:])
    else:
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
