"""End a process that imported torch without the interpreter's last garbage collection.

At exit CPython collects every container object still alive: after torch, torchrec and fbgemm are imported
that walk takes 0.5-1 s (measured here: `import torchrec` then exit, 0.9 s; with the heap frozen first,
0.1 s), paid by every `membench` command and every torchrun agent. Whatever is alive at exit goes with the
process anyway, and exit handlers registered after this one still run before it (atexit runs them last
registered, first run), so freezing the heap changes nothing but the time.
"""
from __future__ import annotations

import atexit
import gc


def skip_final_collection() -> None:
    """Freeze the heap at exit, so the interpreter's final collection has nothing to walk."""
    atexit.register(gc.freeze)
