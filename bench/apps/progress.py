"""Progress on long work: a sweep's points as they end, and throttled lines from long loops.

A sweep (`membench run|plan|provision -m ...`) counts its points from the overrides before any runs
(the product of the sweep lengths, as Hydra's basic sweeper expands them) and, as each point ends:

    [2/4] workload.batch_size=16 workload.seed=0 → ok, peak 22.7 MiB, 6.1 s; elapsed 0:00:12, ETA 0:00:24

On a terminal that is a rich progress bar (k/N, elapsed, time left; the last point in its text), else
one plain line per point, never both. The ETA assumes the remaining points take as long as the
finished ones did on average (counted from the first point's start, so start-up is not in it).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, TextIO

from bench.apps.console import human_bytes, make_console
from bench.run.step_progress import clock

ARROW = "→"
MULTIRUN_FLAGS = ("-m", "--multirun")


def is_multirun(args: Sequence[str]) -> bool:
    return any(arg in MULTIRUN_FLAGS for arg in args)


def _glob_size(group: str, value, conf_dir: Optional[str]) -> Optional[int]:
    """How many options of a config group a glob(...) sweep selects (files conf/<group>/*.yaml)."""
    if conf_dir is None:
        return None
    folder = Path(conf_dir) / group
    if not folder.is_dir():
        return None
    return len(value.filter(sorted(path.stem for path in folder.glob("*.yaml"))))


def sweep_axes(args: Sequence[str], conf_dir: Optional[str] = None) -> Optional[List[tuple]]:
    """(key, number of values or None when unknown) of each swept override in a command line; None when
    the overrides do not parse (Hydra says why when it runs)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    overrides = [arg for arg in args if not arg.startswith("-") and "=" in arg]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # a bad override: Hydra reports it, progress just does not count
        return None
    axes = []
    for override in parsed:
        if not override.is_sweep_override():
            continue
        key = override.get_key_element().lstrip("+~")
        value = override.value()
        try:
            size = (_glob_size(key, value, conf_dir) if isinstance(value, Glob)
                    else len(list(override.sweep_string_iterator())))
        except Exception:  # interval(...) sweeps are for optimizing sweepers: no count
            size = None
        axes.append((key, size))
    return axes


def count_points(axes: Optional[List[tuple]]) -> Optional[int]:
    """The number of jobs Hydra's basic sweeper will run: the product of the sweep lengths."""
    if axes is None or any(size is None for _, size in axes):
        return None
    total = 1
    for _, size in axes:
        total *= size
    return total


@dataclass(frozen=True)
class PointDone:
    """One finished point, as the progress line tells it."""
    index: int  # 1-based
    total: Optional[int]
    overrides: Sequence[str]  # the point's swept overrides (all its overrides when none are known)
    status: str
    peak_bytes: Optional[int]
    point_s: float
    elapsed_s: float  # since the sweep started
    points_s: Optional[float] = None  # since its first point started (start-up excluded); elapsed_s if unknown

    @property
    def eta_s(self) -> Optional[float]:
        if self.total is None:
            return None
        spent = self.elapsed_s if self.points_s is None else self.points_s
        return spent / self.index * max(0, self.total - self.index)

    def describe(self) -> str:
        """overrides -> status, peak, time: the part a bar shows as its text too."""
        peak = f", peak {human_bytes(self.peak_bytes)}" if self.peak_bytes is not None else ""
        return f"{' '.join(self.overrides) or '(no overrides)'} {ARROW} {self.status}{peak}, {self.point_s:.1f} s"

    def line(self) -> str:
        count = f"{self.index}/{self.total}" if self.total is not None else f"{self.index}/?"
        eta = f", ETA {clock(self.eta_s)}" if self.eta_s is not None else ""
        return f"[{count}] {self.describe()}; elapsed {clock(self.elapsed_s)}{eta}"


class SweepProgress:
    """Counts a sweep's points as they end; a rich bar on a terminal, else one plain line per point."""

    def __init__(self, total: Optional[int], swept_keys: Sequence[str], terminal: Optional[bool] = None,
                 out: Optional[TextIO] = None, now: Callable[[], float] = time.monotonic):
        self.total = total
        self.swept_keys = list(swept_keys)
        self.out = out
        stream = out if out is not None else sys.stdout
        self.terminal = stream.isatty() if terminal is None else terminal
        self.now = now
        self.started = now()
        self.first_point_at: Optional[float] = None
        self.done = 0
        self._bar = None
        self._task = None

    @classmethod
    def for_args(cls, args: Sequence[str], conf_dir: Optional[str] = None, **kwargs) -> "SweepProgress":
        axes = sweep_axes(args, conf_dir)
        return cls(count_points(axes), [key for key, _ in axes or ()], **kwargs)

    def shown_overrides(self, overrides: Sequence[str]) -> List[str]:
        """The swept overrides of a point (the others are the same for every point)."""
        def key(item: str) -> str:
            return item.split("=", 1)[0].lstrip("+~")
        swept = [item for item in overrides if key(item) in self.swept_keys]
        return swept or [item for item in overrides if not key(item).startswith(("results_dir", "hydra."))]

    def point_started(self) -> None:
        """Before a point runs: the bar appears with the first one (not for -m --help, which runs none)."""
        if self.first_point_at is None:
            self.first_point_at = self.now()
        if self.terminal and self._bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            # the ETA is the lines' own (rich's needs several updates within its window to guess one)
            self._bar = Progress(TextColumn("sweep"), BarColumn(bar_width=20), MofNCompleteColumn(),
                                 TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                                 TextColumn("{task.description}"), console=make_console(), transient=False)
            self._task = self._bar.add_task("", total=self.total, eta=clock(None))
            self._bar.start()

    def point_done(self, overrides: Sequence[str], status: str, peak_bytes: Optional[int],
                   point_s: float) -> PointDone:
        self.done += 1
        if self.total is not None and self.done > self.total:
            self.total = None  # a sweep the overrides did not describe (hydra.sweeper.params): count on
            if self._bar is not None:
                self._bar.update(self._task, total=None)
        moment = self.now()
        point = PointDone(self.done, self.total, self.shown_overrides(overrides), str(status), peak_bytes,
                          point_s, moment - self.started,
                          None if self.first_point_at is None else moment - self.first_point_at)
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"last: {point.describe()}", eta=clock(point.eta_s))
        elif not self.terminal:
            print(point.line(), file=self.out or sys.stdout, flush=True)
        return point

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


class Throttled:
    """Progress lines from a long loop, at most one per `every_s` seconds and none in its first
    `after_s` (a quick loop prints nothing)."""

    def __init__(self, say: Callable[[str], None], every_s: float = 5.0, after_s: float = 2.0,
                 now: Callable[[], float] = time.monotonic):
        self.say = say
        self.every_s = every_s
        self.now = now
        self.started = now()
        self.next_at = self.started + after_s

    def __call__(self, make_line: Callable[[float], str]) -> bool:
        """Say make_line(elapsed seconds) when due; True when it did."""
        moment = self.now()
        if moment < self.next_at:
            return False
        self.next_at = moment + self.every_s
        self.say(make_line(moment - self.started))
        return True


class Ticker:
    """A line every `every_s` seconds while a step with no loop of its own runs (placing and predicting
    terabyte-scale tables), from `after_s` on: the user sees it is still working and for how long."""

    def __init__(self, say: Callable[[str], None], make_line: Callable[[float], str], every_s: float = 10.0,
                 after_s: float = 5.0):
        import threading

        self.say, self.make_line = say, make_line
        self.every_s, self.after_s = every_s, after_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="membench-progress", daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        wait = self.after_s
        while not self._stop.wait(wait):
            self.say(self.make_line(time.monotonic() - started))
            wait = self.every_s

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
