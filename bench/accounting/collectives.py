"""Collectives finished where they are launched, so that every buffer they hold is freed on the training thread.

gloo runs a collective on one of its worker threads, and that thread keeps the work (and with it the
collective's tensors) until a moment after the work completes. When the training thread has already
dropped a buffer, the worker's release is the last one and frees it, at a moment that varies from run to
run: the accounting would not repeat. So the tracker completes each collective at its launch: it waits for
the work, then for every gloo thread of the process to be idle again (blocked, not running: the worker has
let go of the work). Afterwards only the training thread can drop the last reference, at the same point
of the program in every run. Waiting early changes no allocation or free of the training thread; it only
gives up the overlap of communication with compute, which a CPU rank's memory figures do not depend on.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterable, List

import torch
from torch._C._distributed_c10d import Work

# the worker threads gloo's process groups run collectives on, and its transport loop (Linux thread names)
GLOO_THREAD_NAMES = ("pt_gloo_runloop", "gloo_tcp_loop")
TASKS_DIR = Path("/proc/self/task")
IDLE_POLL_S = 0.0001
IDLE_READS_IN_A_ROW = 2
IDLE_TIMEOUT_S = 5.0


def works_in(values: Iterable[object]) -> List[Work]:
    """The c10d works among a c10d op's outputs (the dispatcher hands them over as script objects)."""
    return [Work.unbox(value) for value in values if isinstance(value, torch.ScriptObject)]


def _read_small(path: str) -> str:
    # os-level reads: a collective polls every thread's stat several times, pathlib's file objects cost 4x
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 512).decode(errors="replace")
    finally:
        os.close(fd)


def _name_and_state(stat: str):
    # "tid (comm) state ...": comm may itself hold spaces or parentheses
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]


class _NamedThreads:
    """Which of this process's threads bear one of some names, rescanned only when the set of threads changes:
    a collective's idle wait reads a few gloo threads' stat lines instead of every thread's (about 3x faster
    with an OpenMP pool and autograd's threads beside gloo's)."""

    def __init__(self):
        self._key = None
        self._tids: List[str] = []

    def tids(self, tasks: str, names) -> List[str]:
        listing = os.listdir(tasks)
        key = (tasks, tuple(names), frozenset(listing))
        if key != self._key:
            self._tids = [tid for tid in listing if _stat_name(tasks, tid) in names]
            self._key = key
        return self._tids

    def forget(self) -> None:
        self._key = None


def _stat_name(tasks: str, tid: str):
    try:
        return _name_and_state(_read_small(f"{tasks}/{tid}/stat"))[0]
    except OSError:  # the thread ended between listing and reading
        return None


_NAMED_THREADS = _NamedThreads()


def _thread_states(names=GLOO_THREAD_NAMES) -> List[str]:
    """Scheduler state ('R' running, 'S' sleeping, ...) of each thread of this process named in `names`."""
    states = []
    tasks = str(TASKS_DIR)
    for tid in _NAMED_THREADS.tids(tasks, names):
        try:
            name, state = _name_and_state(_read_small(f"{tasks}/{tid}/stat"))
        except OSError:  # the thread ended between listing and reading
            continue
        if name not in names:  # renamed since the scan: look again
            _NAMED_THREADS.forget()
            return _thread_states(names)
        states.append(state)
    return states


def gloo_threads_idle() -> bool:
    return all(state in "SD" for state in _thread_states())


def wait_until_gloo_idle(timeout_s: float = IDLE_TIMEOUT_S) -> bool:
    """Poll until every gloo thread is blocked (idle) on IDLE_READS_IN_A_ROW reads in a row; False after
    `timeout_s` without that, or where threads cannot be inspected (no /proc)."""
    if not os.path.isdir(TASKS_DIR):
        return False
    deadline = time.monotonic() + timeout_s
    idle_reads = 0
    while time.monotonic() < deadline:
        idle_reads = idle_reads + 1 if gloo_threads_idle() else 0
        if idle_reads >= IDLE_READS_IN_A_ROW:
            return True
        time.sleep(IDLE_POLL_S)
    return False


def complete_collectives(outputs: Iterable[object]) -> bool:
    """Wait for the works among a c10d op's `outputs`, then for gloo's threads to let go of them; False when
    the threads could not be seen idle (their late frees are then applied at the phase end)."""
    works = works_in(outputs)
    if not works:
        return True
    for work in works:
        work.wait()
    return wait_until_gloo_idle()
