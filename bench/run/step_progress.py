"""A long run's progress across its ranks, from their timelines, while torchrun runs.

Rank 0 prints each step it finishes; a slow or stuck rank elsewhere does not show there. Each rank's
timeline_rank<R>.csv gets a row, flushed, at every phase end, so its last row is where that rank is.
From `after_s` on, every `every_s` seconds, one line says where the slowest and fastest ranks are and
how long the rest should take at the rate the slowest rank has kept:

    [membench] run 20261203-...: 0:00:20, ranks at step 3-4 of 6 (slowest: rank 1, step 3 backward), ETA 0:00:11
"""
from __future__ import annotations

import csv
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from bench.results.store import timeline_file

TAIL_BYTES = 4096  # a timeline row is well under 200 bytes


@dataclass(frozen=True)
class RankPosition:
    step: int  # -1 while the model is built
    phase: str


def last_position(path: Path) -> Optional[RankPosition]:
    """The step and phase of a timeline's last complete row; None before the first one."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = tail.split("\n")[:-1]  # the text after the last newline is a row still being written
    for line in reversed(lines):
        try:
            row = next(csv.reader([line]))
            return RankPosition(int(row[1]), row[2])
        except (StopIteration, IndexError, ValueError):  # the header, or the start of the tail window
            continue
    return None


def clock(seconds: Optional[float]) -> str:
    """0:01:05 (h:mm:ss), as rich's progress columns show time."""
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def describe(run_id: str, positions: Dict[int, RankPosition], local_ranks: int, total_steps: int,
             elapsed_s: float, eta_s: Optional[float]) -> str:
    """One progress line from each rank's position (this machine's ranks without a timeline row yet are
    starting; other machines' ranks write their timelines there)."""
    head = f"[membench] run {run_id}: {clock(elapsed_s)}"
    if not positions:
        return f"{head}, waiting for {local_ranks} rank(s) to start"
    starting = local_ranks - len(positions)
    slowest_rank, slowest = min(positions.items(), key=lambda item: (item[1].step, item[0]))
    fastest = max(position.step for position in positions.values())
    if fastest < 0:
        text = f"{head}, building the model on {len(positions)} rank(s)"
    else:
        steps = f"{slowest.step + 1}" if slowest.step == fastest else f"{max(slowest.step, 0) + 1}-{fastest + 1}"
        where = "building" if slowest.step < 0 else f"step {slowest.step + 1} {slowest.phase}"
        text = f"{head}, ranks at step {steps} of {total_steps} (slowest: rank {slowest_rank}, {where})"
    if starting > 0:
        text += f", {starting} rank(s) starting"
    if eta_s is not None:
        text += f", ETA {clock(eta_s)}"
    return text


WATCHER_THREAD = "membench-steps"


class StepWatcher:
    """Prints the ranks' step progress while a run's torchrun runs (a context manager around it)."""

    def __init__(self, run_dir: Path, run_id: str, world_size: int, total_steps: int,
                 local_ranks: Optional[int] = None, say: Callable[[str], None] = lambda line: print(line, flush=True),
                 every_s: float = 10.0, after_s: float = 5.0, poll_s: float = 1.0, enabled: bool = True,
                 ranks: Optional[Sequence[int]] = None, start_on_enter: bool = True):
        self.start_on_enter = start_on_enter  # False: the caller calls start() (after forking its agents)
        self.run_dir, self.run_id = Path(run_dir), run_id
        self.ranks = tuple(range(world_size)) if ranks is None else tuple(ranks)  # those that write timelines
        self.world_size, self.total_steps = world_size, total_steps
        self.local_ranks = world_size if local_ranks is None else local_ranks
        self.say, self.every_s, self.after_s, self.poll_s = say, every_s, after_s, poll_s
        self.enabled = enabled and world_size > 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._first_step: Optional[tuple] = None  # (time, slowest step) when the slowest rank began training

    def positions(self) -> Dict[int, RankPosition]:
        found = {}
        for rank in self.ranks:
            position = last_position(timeline_file(self.run_dir, rank))
            if position is not None:
                found[rank] = position
        return found

    def eta(self, positions: Dict[int, RankPosition], now: float) -> Optional[float]:
        """Time left at the slowest rank's rate since it began its first step (None before that rate exists)."""
        if len(positions) < self.local_ranks:
            return None
        slowest = min(position.step for position in positions.values())
        if slowest < 0:
            return None
        if self._first_step is None:
            self._first_step = (now, slowest)
            return None
        began, first = self._first_step
        if slowest <= first or now <= began:
            return None
        per_step = (now - began) / (slowest - first)
        return per_step * (self.total_steps - slowest)

    def line(self, elapsed_s: float) -> str:
        positions = self.positions()
        return describe(self.run_id, positions, self.local_ranks, self.total_steps, elapsed_s,
                        self.eta(positions, time.monotonic()))

    def _run(self) -> None:
        # polled every poll_s (the rate starts when the slowest rank does), said every every_s
        started = time.monotonic()
        say_at = started + self.after_s
        while not self._stop.wait(self.poll_s):
            try:
                now = time.monotonic()
                if now >= say_at:
                    self.say(self.line(now - started))
                    say_at = now + self.every_s
                else:
                    self.eta(self.positions(), now)
            except Exception:  # progress must never disturb the run
                return

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name=WATCHER_THREAD, daemon=True)
            self._thread.start()

    def __enter__(self) -> "StepWatcher":
        if self.start_on_enter:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
