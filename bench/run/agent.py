"""torchrun's agent as membench starts it: `python -m bench.run.agent ARGS` is `python -m torch.distributed.run
ARGS` (the same arguments, behaviour and exit status), ending without the interpreter's final collection
(bench.run.quick_exit: half a second of every run)."""
from __future__ import annotations

import runpy

from bench.run.quick_exit import skip_final_collection

if __name__ == "__main__":
    skip_final_collection()
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
