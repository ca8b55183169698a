"""`membench report`: figures and a markdown report from run results (matplotlib, Agg backend).

    membench report <paths...> [--out DIR] [--format png,svg]
    python -m bench.report <paths...>          # the same

A path may be a run directory, a sweep directory or any results root: every `summary.json` below it is
read (with `bench.results.load_summary`; a corrupt one is skipped with a warning). The report directory
gets one PNG/SVG per figure and `report.md`, which embeds the figures, each followed by a table of the
numbers behind it (taken from the summaries unchanged; memory in the figure's unit with 3 decimals and
in raw bytes):

1. memory timeline per rank of a few representative runs (phases shaded, peak marked, capacity);
2. breakdown at peak per run and rank (bench.results.CATEGORIES), absolute and as a share of the peak;
3. utilization CDF over runs x ranks, with the under-utilized share (< 50 % of capacity);
4. imbalance: per-rank peaks of every run, runs sorted by imbalance (max / mean rank peak);
5. OOM frontier of each sweep over two (or more) overrides: busiest-rank utilization, OOM cells marked;
6. estimated vs measured peak per rank (runs whose summary carries `estimate.per_rank_peak`);
7. plan mode at scale: estimated per-rank utilization across world sizes (summaries with mode "plan").

A figure without data is skipped with a line in report.md that says why. Exit status: 0, or 2 when no
summary could be read (one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from bench.results import CATEGORIES, ResultsError, RunSummary, atomic_write_text, load_summary

PROG = "membench report"
EXIT_NO_RESULTS = 2
FORMATS = ("png", "svg", "pdf")
KIB, MIB, GIB = 1024, 1024**2, 1024**3
BALANCED = 1.001  # imbalance below this counts as balanced (figure 4 draws only a few of those)
UNDER_UTILIZED = 0.5  # the paper's threshold: a rank using less than half its memory is under-utilized
PHASES = ("build", "input", "forward", "backward", "optimizer")

# Okabe & Ito (2008): distinguishable with every common colour-vision deficiency.
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
PHASE_COLORS = {"build": "#BBBBBB", "input": "#F0E442", "forward": "#56B4E9", "backward": "#E69F00",
                "optimizer": "#009E73"}
# Paul Tol's "muted" scheme (colour-blind safe), one fixed colour per breakdown category.
CATEGORY_COLORS = {
    "embedding_weights": "#332288", "embedding_optimizer": "#88CCEE", "embedding_grads": "#44AA99",
    "dense_params": "#117733", "dense_grads": "#999933", "dense_optimizer": "#DDCC77",
    "activations": "#CC6677", "comm_buffers": "#882255", "allocator_overhead": "#AA4499",
    "non_torch": "#555555", "other": "#DDDDDD",
}
STATUS_TEXT_COLOR = "#333333"
OOM_FACE = "#D55E00"

# Short names of config keys in labels; group selections (workload=small) show only their value.
SHORT_KEYS = {
    "workload.batch_size": "batch", "workload.global_batch_size": "global batch", "workload.rows": "rows",
    "workload.num_tables": "tables", "workload.embedding_dim": "dim", "hardware.capacity_gib": "capacity GiB",
    "world_size": "world", "workload.rows_max": "rows max", "workload.rows_min": "rows min",
    "workload.ids.zipf_alpha": "zipf", "workload.pooling.mean": "pooling",
}
GROUP_KEYS = ("mode", "workload", "sharding", "hardware", "model", "record")
# Keys that never describe what a run measured
IGNORED_KEYS = {"results_dir", "run_id", "timeout_s", "hydra.verbose"}


class NoResults(Exception):
    """Nothing to report; the message is the one line printed on stderr."""


def info(message: str) -> None:
    print(f"[report] {message}", flush=True)


def warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------
def natural_key(text: str) -> List[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def flatten(data: Any, prefix: str = "") -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}{key}."))
    else:
        flat[prefix[:-1]] = data
    return flat


def hashable(value: Any) -> Any:
    """A comparable form: overrides are strings ("512"), config values typed (512); both compare as "512"."""
    if value is None:
        return None
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True).replace(" ", "")
    if isinstance(value, str) and value.startswith("["):
        return value.replace(" ", "")
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_overrides(items: Iterable[str]) -> Dict[str, str]:
    parsed: Dict[str, str] = {}
    for item in items:
        if "=" not in str(item):
            continue
        key, value = str(item).split("=", 1)
        key = key.lstrip("+~")
        if key in IGNORED_KEYS or key.startswith("hydra."):
            continue
        parsed[key] = value
    return parsed


@dataclass
class Sweep:
    dir: Path
    sweep_id: str
    # dir name of each point -> sweep.json entry (may list points whose summary is missing)
    points: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    has_index: bool = False
    varying: List[str] = field(default_factory=list)


@dataclass
class Run:
    dir: Path
    summary: RunSummary
    config: Dict[str, Any]
    sweep: Optional[Sweep] = None
    overrides: Dict[str, str] = field(default_factory=dict)
    label: str = ""
    _timelines: Optional[Dict[int, Any]] = None

    @property
    def s(self) -> RunSummary:
        return self.summary

    def value(self, key: str) -> Any:
        """The value of a config key (or group) for labels and sweep axes: for a group (workload=...)
        the name the run resolved to (workload.name may be overridden), else the sweep's override."""
        special = {"mode": self.s.mode, "workload": self.s.workload, "hardware": self.s.hardware,
                   "world_size": self.s.world_size or None, "sharding": self.config.get("sharding.type")}
        if special.get(key) is not None:
            return special[key]
        if key in self.overrides:
            return self.overrides[key]
        if key in self.config:
            return self.config[key]
        if f"{key}.name" in self.config:
            return self.config[f"{key}.name"]
        return None

    def measured_ranks(self):
        return [r for r in self.s.per_rank if r.status == "ok"]

    def timelines(self) -> Dict[int, Any]:
        if self._timelines is None:
            import pandas as pd

            self._timelines = {}
            for path in sorted(self.dir.glob("timeline_rank*.csv"), key=lambda p: natural_key(p.name)):
                rank = int(re.findall(r"\d+", path.stem)[-1])
                try:
                    frame = pd.read_csv(path)
                except Exception as err:  # empty or torn file: report the rest
                    warn(f"skipping timeline {path}: {err.__class__.__name__}: {err}")
                    continue
                if len(frame) and {"step", "phase", "in_use_bytes", "phase_peak_bytes"} <= set(frame.columns):
                    self._timelines[rank] = frame
        return self._timelines


def find_summary_files(path: Path, skip: Optional[Path]) -> List[Path]:
    if path.is_file():
        if path.name == "summary.json":
            return [path]
        raise NoResults(f"{PROG}: {path} is not a results directory or summary.json; give a run, sweep or "
                        f"results directory")
    if not path.exists():
        raise NoResults(f"{PROG}: {path} does not exist; run `membench run` first or check the path")
    try:
        os.listdir(path)
    except OSError as err:
        raise NoResults(f"{PROG}: cannot read {path} ({err.strerror or err}); no summary.json read; "
                        f"check its permissions") from None
    found: List[Path] = []

    def on_error(err: OSError) -> None:
        warn(f"cannot read {err.filename} ({err.strerror}); skipped")

    for root, dirs, files in os.walk(path, onerror=on_error):
        root_path = Path(root)
        dirs[:] = sorted((d for d in dirs if not d.startswith(".")
                          and (skip is None or (root_path / d).resolve() != skip)), key=natural_key)
        if "summary.json" in files:
            found.append(root_path / "summary.json")
    return found


def load_config(run_dir: Path) -> Dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
    except Exception as err:
        warn(f"{path}: unreadable config ({err.__class__.__name__}); labels and sweep axes use the summary")
        return {}
    return {k: hashable(v) for k, v in flatten(data).items()} if isinstance(data, dict) else {}


def load_sweep(sweep_dir: Path) -> Sweep:
    sweep = Sweep(dir=sweep_dir, sweep_id=sweep_dir.name)
    index = sweep_dir / "sweep.json"
    if index.exists():
        try:
            data = json.loads(index.read_text())
            sweep.sweep_id = str(data.get("sweep_id") or sweep_dir.name)
            for entry in data.get("runs", []):
                name = str(entry.get("dir") or str(entry.get("run_id", "")).split("/")[-1])
                sweep.points[name] = entry
            sweep.has_index = True
        except (OSError, ValueError, AttributeError, TypeError) as err:
            warn(f"{index}: unreadable sweep index ({err.__class__.__name__}); sweep axes come from configs")
    return sweep


def load_runs(paths: Sequence[Path], skip: Optional[Path]) -> Tuple[List[Run], List[Sweep]]:
    files: List[Path] = []
    seen = set()
    for path in paths:
        for found in find_summary_files(path, skip):
            key = found.resolve()
            if key not in seen:
                seen.add(key)
                files.append(found)
    if not files:
        where = ", ".join(str(p) for p in paths)
        raise NoResults(f"{PROG}: no summary.json under {where}; run `membench run` first")
    runs: List[Run] = []
    sweeps: Dict[Path, Sweep] = {}
    for path in files:
        try:
            summary = load_summary(path)
        except ResultsError as err:
            warn(f"skipping {path}: {err}")
            continue
        except Exception as err:  # a summary with fields of the wrong shape
            warn(f"skipping {path}: {err.__class__.__name__}: {err}")
            continue
        run_dir = path.parent
        run = Run(dir=run_dir, summary=summary, config=load_config(run_dir))
        parent = run_dir.parent
        if (parent / "sweep.json").exists() or (summary.sweep_id and parent.name == summary.sweep_id):
            sweep = sweeps.get(parent.resolve())
            if sweep is None:
                sweep = sweeps[parent.resolve()] = load_sweep(parent)
            run.sweep = sweep
            entry = sweep.points.get(run_dir.name)
            if entry:
                run.overrides = parse_overrides(entry.get("overrides") or [])
        runs.append(run)
    if not runs:
        where = ", ".join(str(p) for p in paths)
        raise NoResults(f"{PROG}: no readable summary.json under {where} ({len(files)} skipped as corrupt); "
                        f"run `membench run` first")
    runs.sort(key=lambda r: natural_key(str(r.dir)))
    for sweep in sweeps.values():
        members = [r for r in runs if r.sweep is sweep]
        sweep.varying = sweep_varying_keys(sweep, members)
    assign_labels(runs)
    return runs, sorted(sweeps.values(), key=lambda s: natural_key(str(s.dir)))


def independent_keys(candidates: Sequence[str], rows: Sequence[Callable[[str], Any]]) -> List[str]:
    """Keys, in order, that each split the rows further (drops keys determined by earlier ones)."""
    chosen: List[str] = []
    combos = 1
    for key in candidates:
        values = {hashable(value(key)) for value in rows} - {None}
        if len(values) < 2:
            continue
        together = {tuple(hashable(value(k)) for k in [*chosen, key]) for value in rows}
        if len(together) > combos:
            chosen.append(key)
            combos = len(together)
    return chosen


def sweep_varying_keys(sweep: Sweep, members: List[Run]) -> List[str]:
    if sweep.has_index and sweep.points:
        parsed = [parse_overrides(p.get("overrides") or []) for p in sweep.points.values()]
        order: List[str] = []
        for overrides in parsed:
            order += [k for k in overrides if k not in order]
        return independent_keys(order, [lambda k, o=o: o.get(k) for o in parsed])
    keys = sorted({k for run in members for k in run.config if k not in IGNORED_KEYS})
    first = [k for k in ("workload.name", "sharding.type", "hardware.name") if k in keys]
    return independent_keys(first + [k for k in keys if k not in first], [r.value for r in members])


def fmt_value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isfinite(number) and number.is_integer() and not (isinstance(value, str) and "." in value):
        n = int(number)
        if abs(n) >= 1_000_000 and n % 100_000 == 0:
            return f"{n / 1e6:g}M"
        if abs(n) >= 10_000 and n % 1_000 == 0:
            return f"{n / 1e3:g}k"
        return str(n)
    return f"{number:g}"


def key_part(key: str, value: Any) -> str:
    if key in GROUP_KEYS:
        return fmt_value(value)
    if key == "hardware.capacity_gib":
        return f"cap {fmt_value(value)} GiB"
    name = SHORT_KEYS.get(key, key.split(".")[-1])
    return f"{name}={fmt_value(value)}"


def assign_labels(runs: List[Run]) -> None:
    """Short labels from what differs between the runs of each mode (train, plan): groups first, then
    swept keys, then other config keys until the labels are unique."""
    modes: Dict[str, List[Run]] = {}
    for run in runs:
        modes.setdefault(run.s.mode, []).append(run)
    for members in modes.values():
        assign_labels_within(members)


def assign_labels_within(runs: List[Run]) -> None:
    sweep_keys: List[str] = []
    for run in runs:
        if run.sweep:
            sweep_keys += [k for k in run.sweep.varying if k not in sweep_keys]
    primary = ["workload", "sharding", "hardware", "world_size"]
    primary += [k for k in sweep_keys if k not in primary and k not in
                ("workload.name", "sharding.type", "hardware.name")]
    keys = independent_keys(primary, [r.value for r in runs])

    def labels_for(keys_: List[str]) -> List[str]:
        labels_ = []
        for r in runs:
            parts = [key_part(k, r.value(k)) for k in keys_ if r.value(k) is not None]
            labels_.append(" · ".join(parts) or f"{r.s.workload} {r.s.status} ({r.s.run_id.split('/')[-1]})")
        return labels_

    labels = labels_for(keys)
    if len(set(labels)) < len(runs):
        others = sorted({k for r in runs for k in r.config if k not in IGNORED_KEYS and
                         not k.startswith(("workload.name", "sharding.type", "hardware.name"))})
        extra = [k for k in independent_keys(keys + others, [r.value for r in runs]) if k not in keys]
        for key in extra[:3]:
            keys.append(key)
            labels = labels_for(keys)
            if len(set(labels)) == len(runs):
                break
    if not keys:
        labels = [f"{r.s.workload} · {r.value('sharding') or r.s.hardware}" for r in runs]
    counts: Dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    for run, label in zip(runs, labels):
        run.label = label if counts[label] == 1 else f"{label} ({run.s.run_id.split('/')[-1]})"


# ------------------------------------------------------------------------------------------------
# Formatting
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    name: str
    scale: int

    def __call__(self, nbytes: float) -> float:
        return nbytes / self.scale

    def fmt(self, nbytes: Optional[float]) -> str:
        return "—" if nbytes is None else f"{nbytes / self.scale:.3f}"


def pick_unit(values: Iterable[Optional[float]]) -> Unit:
    """GiB, or MiB when every value is below 1 GiB (the axis label says which)."""
    top = max((v for v in values if v is not None and math.isfinite(v)), default=0)
    return Unit("GiB", GIB) if top >= GIB else Unit("MiB", MIB)


def pct(fraction: Optional[float], digits: int = 3) -> str:
    return "—" if fraction is None else f"{fraction * 100:.{digits}f}"


def md_escape(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(md_escape(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def oom_in_use(rank) -> int:
    """Bytes in use when the allocation failed. `stats` are taken after the error unwound (temporaries
    freed), so the rank's peak counts when it was reached in the failing step and phase."""
    event = rank.oom or {}
    in_use = int((event.get("stats") or {}).get("live_bytes", 0) or 0)
    if rank.peak_step == event.get("step") and rank.peak_phase == event.get("phase"):
        in_use = max(in_use, rank.peak_bytes)
    return in_use


def at(step: int, phase: str) -> str:
    if step is None or step < 0:
        return phase or "build"
    return f"step {step} {phase}".strip()


# ------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------
@dataclass
class Section:
    number: int
    title: str
    intro: str = ""
    figures: List[Tuple[str, List[Path], str]] = field(default_factory=list)  # (caption, files, table md)
    skipped: Optional[str] = None
    notes: List[str] = field(default_factory=list)


class Plotter:
    def __init__(self, out: Path, formats: Sequence[str]):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from cycler import cycler

        self.plt = plt
        self.out = out
        self.formats = list(formats)
        plt.rcParams.update({
            "font.size": 10, "axes.titlesize": 12, "axes.labelsize": 10.5, "xtick.labelsize": 9,
            "ytick.labelsize": 9, "legend.fontsize": 9, "figure.titlesize": 13,
            "axes.prop_cycle": cycler(color=OKABE_ITO), "axes.spines.top": False,
            "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "grid.linewidth": 0.6,
            "svg.hashsalt": "membench", "savefig.bbox": "tight", "savefig.pad_inches": 0.15,
        })

    def save(self, fig, stem: str) -> List[Path]:
        paths = []
        for fmt in self.formats:
            path = self.out / f"{stem}.{fmt}"
            metadata = {"Date": None} if fmt in ("svg", "pdf") else {"Software": None}
            fig.savefig(path, dpi=150, metadata=metadata)
            paths.append(path)
        self.plt.close(fig)
        return paths


def representative_runs(runs: List[Run]) -> List[Tuple[Run, str]]:
    """Up to three runs worth a timeline: the busiest ok run, the most imbalanced one, one OOM run."""
    candidates = [r for r in runs if r.s.mode != "plan" and r.s.per_rank and
                  any(r.dir.glob("timeline_rank*.csv"))]
    picks: List[Tuple[Run, str]] = []
    ok = [r for r in candidates if r.s.status == "ok" and r.measured_ranks()]
    if ok:
        busiest = max(ok, key=lambda r: (max(x.utilization for x in r.measured_ranks()), natural_key(str(r.dir))))
        picks.append((busiest, "highest utilization"))
        imbalanced = max(ok, key=lambda r: r.s.job.imbalance)
        if imbalanced is not busiest and imbalanced.s.job.imbalance > 1.01:
            picks.append((imbalanced, f"most imbalanced, {imbalanced.s.job.imbalance:.3f}"))
    ooms = [r for r in candidates if r.s.status == "oom"]
    if ooms:
        def oom_depth(run: Run) -> Tuple[int, int, float]:
            events = [x.oom for x in run.s.per_rank if x.oom]
            step, phase = max(((e.get("step", -1), PHASES.index(e["phase"]) if e.get("phase") in PHASES else -1)
                               for e in events), default=(-1, -1))
            return step, phase, max(x.peak_bytes / x.capacity_bytes if x.capacity_bytes else 0 for x in run.s.per_rank)

        picks.append((max(ooms, key=oom_depth), "out of memory"))
    if not picks and candidates:
        picks.append((candidates[0], "first run"))
    return picks[:3]


def shown_ranks(run: Run, available: Sequence[int], limit: int = 4) -> List[int]:
    if len(available) <= limit:
        return list(available)
    by_rank = {r.rank: r for r in run.s.per_rank}
    chosen = [r for r in run.s.oom_ranks[:1] if r in available]
    ordered = sorted(available, key=lambda k: -(by_rank[k].peak_bytes if k in by_rank else 0))
    for rank in [ordered[0], ordered[-1], *ordered[1:]]:
        if rank not in chosen:
            chosen.append(rank)
        if len(chosen) == limit:
            break
    return sorted(chosen)


def figure_timeline(plot: Plotter, runs: List[Run]) -> Section:
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    section = Section(1, "Memory timeline per rank",
                      "Memory in use on each rank over the run, one slot per recorded phase (build, then "
                      "input / forward / backward / optimizer of every step). The thick line is the highest "
                      "memory in use during the phase, the dashed one what is still live when it ends; the "
                      "star marks the run's reported peak (measured steps, after warm-up).")
    picks = representative_runs(runs)
    if not picks:
        section.skipped = "no run has a timeline_rank<R>.csv (runs with `record.timeline=false` or plan runs only)"
        return section
    for index, (run, reason) in enumerate(picks, start=1):
        frames = run.timelines()
        ranks = shown_ranks(run, sorted(frames))
        if not ranks:
            section.notes.append(f"{run.label}: timeline files unreadable; skipped")
            continue
        by_rank = {r.rank: r for r in run.s.per_rank}
        warmup = run.config.get("workload.warmup_steps")
        values: List[float] = []
        for rank in ranks:
            frame = frames[rank]
            values += list(frame["phase_peak_bytes"].dropna()) + list(frame["in_use_bytes"].dropna())
            for column in ("reserved_bytes",):
                if column in frame:
                    values += list(frame[column].dropna())
        data_top = max(values, default=0)
        capacities = [by_rank[k].capacity_bytes for k in ranks if k in by_rank]
        oom_run = run.s.status == "oom"
        capacity_on_scale = bool(capacities) and (max(capacities) <= 2.5 * data_top or oom_run)
        unit = pick_unit(values + (capacities if capacity_on_scale else []))
        fig, axes = plot.plt.subplots(len(ranks), 1, figsize=(10.5, 1.0 + 2.6 * len(ranks)), sharex=True,
                                      squeeze=False)
        table_rows = []
        drew_star = drew_warmup = drew_request = False
        for ax, rank in zip(axes[:, 0], ranks):
            frame = frames[rank].reset_index(drop=True)
            result = by_rank.get(rank)
            n = len(frame)
            for i, phase in enumerate(frame["phase"]):
                ax.axvspan(i, i + 1, color=PHASE_COLORS.get(str(phase), "#FFFFFF"), alpha=0.22, lw=0)
            peak_y = [unit(v) for v in frame["phase_peak_bytes"]]
            ax.hlines(peak_y, range(n), range(1, n + 1), color=OKABE_ITO[0], lw=2.4, zorder=3)
            ax.vlines(range(1, n), peak_y[:-1], peak_y[1:], color=OKABE_ITO[0], lw=1.0, zorder=3)
            ax.plot([i + 1 for i in range(n)], [unit(v) for v in frame["in_use_bytes"]], ls="--", marker=".",
                    ms=4, lw=1.2, color=OKABE_ITO[5], zorder=4)
            if "reserved_bytes" in frame and frame["reserved_bytes"].notna().any():
                ax.plot([i + 1 for i in range(n)], [unit(v) for v in frame["reserved_bytes"]], lw=1.2,
                        color=OKABE_ITO[2], zorder=3)
            # steady-state boundary
            steps = list(frame["step"])
            if warmup is not None:
                starts = [i for i, s in enumerate(steps) if s >= int(warmup)]
                if starts and starts[0] > 0:
                    ax.axvline(starts[0], color="#444444", lw=1.0, ls=":", zorder=2)
                    drew_warmup = True
            top = data_top
            if result is not None and capacity_on_scale:
                ax.axhline(unit(result.capacity_bytes), color="#000000", ls="-.", lw=1.3, zorder=2)
                top = max(top, result.capacity_bytes)
            if result is not None and result.oom and result.oom.get("requested_bytes"):
                # room for the failed request above what was in use, up to twice the capacity
                wanted = oom_in_use(result) + result.oom["requested_bytes"]
                top = max(top, min(wanted, 2 * result.capacity_bytes))
            ax.set_ylim(0, unit(top) * 1.18 if top else 1)
            if result is not None and result.status == "ok":
                hits = [i for i in range(n) if steps[i] == result.peak_step and
                        str(frame["phase"][i]) == result.peak_phase]
                if hits:
                    x = hits[-1] + 0.5
                    y = unit(result.peak_bytes)
                    ax.plot([x], [y], marker="*", ms=13, color="#000000", zorder=6, mec="white", mew=0.6)
                    drew_star = True
                    right = x > n * 0.6
                    ax.annotate(f"peak {unit.fmt(result.peak_bytes)} {unit.name}", (x, y),
                                xytext=(-10 if right else 10, 6), textcoords="offset points",
                                ha="right" if right else "left", va="bottom", fontsize=9,
                                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.85), zorder=7)
            if result is not None and result.oom:
                event = result.oom
                stats = event.get("stats") or {}
                live = oom_in_use(result) if stats or result.peak_step == event.get("step") \
                    else frame["phase_peak_bytes"].iloc[-1]
                ax.plot([n - 0.5], [unit(live)], marker="X", ms=11, color=OOM_FACE, mec="black", mew=0.6,
                        zorder=6)
                if event.get("requested_bytes"):
                    tip = min(unit(live + event["requested_bytes"]), ax.get_ylim()[1] * 0.97)
                    ax.annotate("", xy=(n - 0.5, tip), xytext=(n - 0.5, unit(live)), zorder=5,
                                arrowprops=dict(arrowstyle="-|>", color=OOM_FACE, lw=1.8, shrinkA=6, shrinkB=0))
                    drew_request = True
            if result is not None and result.oom:
                event = result.oom
                requested = event.get("requested_bytes")
                title = (f"rank {rank}: OOM at {at(event.get('step', -1), event.get('phase', ''))}, "
                         f"{unit.fmt(live)} {unit.name} in use"
                         + (f" + {unit.fmt(requested)} {unit.name} requested" if requested else "")
                         + f" > capacity {unit.fmt(result.capacity_bytes)} {unit.name}")
            elif result is not None:
                title = (f"rank {rank} ({result.status}): peak {unit.fmt(result.peak_bytes)} {unit.name}, "
                         f"capacity {unit.fmt(result.capacity_bytes)} {unit.name}, "
                         f"utilization {pct(result.utilization, 2)} %")
                if not capacity_on_scale:
                    title += " (capacity line off scale)"
            else:
                title = f"rank {rank}"
            ax.set_title(title, fontsize=10, loc="left")
            ax.set_ylabel(f"memory ({unit.name})")
            ax.set_xlim(0, n)
            tick_at, tick_label = [], []
            previous = None
            for i, s in enumerate(steps):
                if s != previous:
                    tick_at.append(i)
                    tick_label.append("build" if s < 0 else str(s))
                    previous = s
            stride = max(1, math.ceil(len(tick_at) / 25))
            ax.set_xticks(tick_at[::stride], tick_label[::stride])
            ax.grid(axis="x", alpha=0.0)
            if result is not None:
                table_rows.append([rank, result.status, unit.fmt(result.peak_bytes), result.peak_bytes,
                                   at(result.peak_step, result.peak_phase), result.capacity_bytes,
                                   pct(result.utilization), result.build_peak_bytes, result.warmup_peak_bytes,
                                   n])
        axes[-1, 0].set_xlabel("step (each step: input | forward | backward | optimizer)"
                               + ("; dotted line: end of warm-up" if drew_warmup else ""))
        present = [p for p in PHASES if any(str(x) == p for k in ranks for x in frames[k]["phase"])]
        handles = [Line2D([], [], color=OKABE_ITO[0], lw=2.4, label="peak within phase"),
                   Line2D([], [], color=OKABE_ITO[5], lw=1.2, ls="--", marker=".", label="in use at phase end")]
        if any("reserved_bytes" in frames[k] and frames[k]["reserved_bytes"].notna().any() for k in ranks):
            handles.append(Line2D([], [], color=OKABE_ITO[2], lw=1.2, label="reserved (allocator)"))
        if capacity_on_scale:
            handles.append(Line2D([], [], color="#000000", ls="-.", lw=1.3, label="capacity"))
        if drew_star:
            handles.append(Line2D([], [], color="#000000", marker="*", ls="", ms=11, label="reported peak"))
        if oom_run:
            handles.append(Line2D([], [], color=OOM_FACE, marker="X", ls="", ms=9, mec="black", label="OOM"))
        if drew_request:
            handles.append(Line2D([], [], color=OOM_FACE, lw=1.8, marker="^", ms=6, label="failed request"))
        handles += [Patch(color=PHASE_COLORS[p], alpha=0.45, label=p) for p in present]
        fig.suptitle(f"Memory timeline: {run.label} ({reason})", x=0.01, ha="left")
        shown = "" if len(ranks) == len(run.s.per_rank) else f"; ranks {', '.join(map(str, ranks))} of {len(run.s.per_rank)}"
        fig.tight_layout(rect=(0, 0.07 if len(ranks) > 1 else 0.12, 1, 1))
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), frameon=False,
                   bbox_to_anchor=(0.5, 0.0))
        files = plot.save(fig, f"fig1_timeline_{index}")
        table = md_table([f"rank", "status", f"peak ({unit.name})", "peak (bytes)", "peak at", "capacity (bytes)",
                          "utilization %", "build peak (bytes)", "warm-up peak (bytes)", "timeline rows"],
                         table_rows)
        caption = f"{run.label}: {reason} (`{run.dir}`{shown})"
        section.figures.append((caption, files, table))
    return section


def measured_ok_runs(runs: List[Run]) -> List[Run]:
    return [r for r in runs if r.s.mode != "plan" and r.s.status == "ok" and r.measured_ranks()]


def figure_breakdown(plot: Plotter, runs: List[Run], max_bars: int = 48) -> Section:
    import numpy as np

    section = Section(2, "Memory breakdown at peak",
                      "What was live at each rank's peak, by category (bench.results.CATEGORIES; they add up to "
                      "the peak). Left: absolute; right: share of the peak. Runs that did not finish (OOM, "
                      "failed) are listed under OOM and failed runs instead.")
    chosen = measured_ok_runs(runs)
    if not chosen:
        section.skipped = "no finished measured run (status ok) to break down"
        return section
    table_bars = [(run, rank) for run in chosen for rank in run.measured_ranks()]
    # a balanced run (every rank within BALANCED of the mean peak) is drawn as one bar: its busiest rank
    groups: List[Tuple[Run, List[Any]]] = []
    merged = 0
    for run in chosen:
        ranks = run.measured_ranks()
        if len(ranks) > 1 and run.s.job.imbalance < BALANCED:
            groups.append((run, [max(ranks, key=lambda x: x.peak_bytes)]))
            merged += 1
        else:
            groups.append((run, ranks))
    if merged:
        section.notes.append(f"{merged} balanced run(s) (imbalance < {BALANCED}) drawn as one bar, their busiest "
                             f"rank; the table lists every rank")
    if sum(len(ranks) for _, ranks in groups) > max_bars:
        groups = [(run, [max(ranks, key=lambda x: x.peak_bytes)]) for run, ranks in groups][:max_bars]
        section.notes.append(f"{len(chosen)} runs: one bar per run (its rank with the highest peak)"
                             + (f"; the first {max_bars} shown" if len(chosen) > max_bars else ""))
    bars = [(run, rank) for run, ranks in groups for rank in ranks]
    used = [c for c in CATEGORIES if any(rank.breakdown.get(c, 0) for _, rank in table_bars)]
    unused = [c for c in CATEGORIES if c not in used]
    unit = pick_unit(rank.peak_bytes for _, rank in table_bars)
    # rows top to bottom: a header row per run (its label), then one bar per rank
    layout: List[Tuple[str, Any, Any]] = []
    for run, ranks in groups:
        layout.append(("header", run, None))
        layout += [("bar", run, rank) for rank in ranks]
    row_in, top_in, bottom_in = 0.27, 1.25, 0.65
    height = top_in + bottom_in + row_in * len(layout)
    fig, (ax_abs, ax_pct) = plot.plt.subplots(1, 2, figsize=(12, height), sharey=True,
                                              gridspec_kw={"width_ratios": [1.3, 1]})
    fig.subplots_adjust(left=0.05, right=0.985, top=1 - top_in / height, bottom=bottom_in / height, wspace=0.06)
    positions = {id(item): len(layout) - 1 - i for i, item in enumerate(layout)}
    y = np.array([positions[id(item)] for item in layout if item[0] == "bar"], dtype=float)
    left_abs = np.zeros(len(bars))
    left_pct = np.zeros(len(bars))
    peaks = np.array([rank.peak_bytes or 1 for _, rank in bars], dtype=float)
    for category in used:
        values = np.array([rank.breakdown.get(category, 0) for _, rank in bars], dtype=float)
        kwargs = dict(color=CATEGORY_COLORS[category], edgecolor="white", linewidth=0.4, height=0.78)
        ax_abs.barh(y, values / unit.scale, left=left_abs, label=category, **kwargs)
        ax_pct.barh(y, values / peaks * 100, left=left_pct, **kwargs)
        left_abs += values / unit.scale
        left_pct += values / peaks * 100
    top_abs = max(left_abs) if len(left_abs) else 1
    for yy, (_, rank) in zip(y, bars):
        ax_abs.text(unit(rank.peak_bytes) + top_abs * 0.01, yy, unit.fmt(rank.peak_bytes), va="center", fontsize=8)
    for item in layout:
        if item[0] == "header":
            yy = positions[id(item)]
            ax_abs.annotate(item[1].label, (0, yy - 0.05), xytext=(4, 0), textcoords="offset points", va="center",
                            ha="left", fontsize=9, fontweight="bold")
            for ax in (ax_abs, ax_pct):
                ax.axhline(yy + 0.5, color="#BBBBBB", lw=0.6)
    ax_abs.set_xlim(0, top_abs * 1.12 if top_abs > 0 else 1)
    tick_labels = []
    for run, rank in bars:
        count = len(run.measured_ranks())
        single = sum(1 for r, _ in bars if r is run) == 1
        tick_labels.append(f"r{rank.rank}" if not single or count == 1 else f"all {count}\nranks")
    ax_abs.set_yticks(y, tick_labels)
    ax_abs.set_xlabel(f"memory at peak ({unit.name})")
    ax_pct.set_xlabel("share of the peak (%)")
    ax_pct.set_xlim(0, 100)
    for ax in (ax_abs, ax_pct):
        ax.grid(axis="y", alpha=0.0)
        ax.set_ylim(-0.6, len(layout) - 0.4)
        ax.tick_params(axis="y", length=0)
    ax_abs.set_title("absolute", fontsize=10, loc="left")
    ax_pct.set_title("share of peak", fontsize=10, loc="left")
    fig.suptitle("Memory breakdown at peak, per run and rank", x=0.01, y=1 - 0.12 / height, ha="left", va="top")
    fig.legend(*ax_abs.get_legend_handles_labels(), loc="upper left", ncol=min(len(used), 6), frameon=False,
               bbox_to_anchor=(0.01, 1 - 0.45 / height), fontsize=9, handlelength=1.4, columnspacing=1.2)
    files = plot.save(fig, "fig2_breakdown")
    rows = []
    for run, rank in table_bars:
        rows.append([run.label, rank.rank, unit.fmt(rank.peak_bytes), rank.peak_bytes,
                     *[rank.breakdown.get(c, 0) for c in used]])
    table = md_table(["run", "rank", f"peak ({unit.name})", "peak (bytes)", *[f"{c} (bytes)" for c in used]], rows)
    if unused:
        section.notes.append("zero in every bar, so not drawn: " + ", ".join(unused))
    section.figures.append(("breakdown at peak", files, table))
    return section


def ecdf(values: Sequence[float]) -> Tuple[List[float], List[float]]:
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def figure_utilization(plot: Plotter, runs: List[Run]) -> Section:
    section = Section(3, "Utilization distribution",
                      "Peak memory / capacity of every rank of every finished measured run (one point per "
                      f"run x rank). Under-utilized: below {UNDER_UTILIZED * 100:.0f} % of capacity.")
    chosen = measured_ok_runs(runs)
    if not chosen:
        section.skipped = "no finished measured run (status ok)"
        return section
    utils = [rank.utilization for run in chosen for rank in run.measured_ranks()]
    under = sum(1 for u in utils if u < UNDER_UTILIZED)
    share = under / len(utils)
    xs, ys = ecdf([u * 100 for u in utils])
    fig, ax = plot.plt.subplots(figsize=(8.5, 4.8))
    ax.axvspan(0, UNDER_UTILIZED * 100, color=OKABE_ITO[4], alpha=0.12, lw=0)
    ax.step([0] + xs, [0] + ys, where="post", color=OKABE_ITO[0], lw=2.2)
    ax.plot(xs, ys, ls="", marker="o", ms=3.5, color=OKABE_ITO[0])
    ax.axvline(UNDER_UTILIZED * 100, color="#000000", ls="--", lw=1.1)
    ax.axhline(share, color="#555555", ls=":", lw=1.0)
    top = max(100.0, max(xs) * 1.05)
    ax.set_xlim(0, top)
    ax.set_ylim(0, 1.02)
    ax.text(UNDER_UTILIZED * 100 + top * 0.01, 0.04,
            f"{under} of {len(utils)} rank-runs ({share * 100:.1f} %)\nuse < {UNDER_UTILIZED * 100:.0f} % of capacity",
            fontsize=9.5, va="bottom", ha="left", bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="#888888"))
    ax.set_xlabel("utilization: peak / capacity (%)")
    ax.set_ylabel("fraction of rank-runs ≤ x")
    ax.set_title(f"Memory utilization CDF ({len(chosen)} runs, {len(utils)} ranks)", loc="left")
    files = plot.save(fig, "fig3_utilization_cdf")
    quantiles = statistics.quantiles(utils, n=4, method="inclusive") if len(utils) > 1 else [utils[0]] * 3
    stats = md_table(["rank-runs", "min %", "p25 %", "median %", "p75 %", "max %", f"< {UNDER_UTILIZED * 100:.0f} %"],
                     [[len(utils), pct(min(utils)), pct(quantiles[0]), pct(quantiles[1]), pct(quantiles[2]),
                       pct(max(utils)), f"{under} ({share * 100:.1f} %)"]])
    per_run = md_table(["run", "rank", "utilization %", "peak (bytes)", "capacity (bytes)"],
                       [[run.label, rank.rank, pct(rank.utilization), rank.peak_bytes, rank.capacity_bytes]
                        for run in chosen for rank in run.measured_ranks()])
    section.figures.append(("utilization CDF", files, stats + "\n\n" + per_run))
    section.intro += (f" **{under} of {len(utils)} rank-runs ({share * 100:.1f} %) are under-utilized.**")
    skipped = [r for r in runs if r.s.mode != "plan" and r not in chosen]
    if skipped:
        section.notes.append(f"{len(skipped)} run(s) not finished (status oom / failed / invalid / timeout) are "
                             f"not in the distribution")
    return section


def figure_imbalance(plot: Plotter, runs: List[Run], max_runs: int = 30) -> Section:
    section = Section(4, "Imbalance across ranks",
                      "Peak of every rank, per run; runs sorted by imbalance (max rank peak / mean rank peak, "
                      "1.0 = balanced). Left: absolute peaks; right: each rank's peak / the run's mean.")
    chosen = [r for r in measured_ok_runs(runs) if len(r.measured_ranks()) >= 1]
    if not chosen:
        section.skipped = "no finished measured run (status ok)"
        return section
    chosen.sort(key=lambda r: (-r.s.job.imbalance, natural_key(str(r.dir))))
    rows = []
    for run in chosen:
        ranks = sorted(run.measured_ranks(), key=lambda x: -x.peak_bytes)
        mean = statistics.fmean(x.peak_bytes for x in ranks)
        rows.append([run.label, len(ranks), f"{run.s.job.imbalance:.4f}", f"r{ranks[0].rank}", ranks[0].peak_bytes,
                     f"r{ranks[-1].rank}", ranks[-1].peak_bytes, f"{mean:.1f}",
                     ", ".join(str(x.peak_bytes) for x in sorted(ranks, key=lambda x: x.rank))])
    # every imbalanced run is drawn; of the balanced ones (< BALANCED) only a few, the table has them all
    drawn = [r for r in chosen if r.s.job.imbalance >= BALANCED]
    balanced = [r for r in chosen if r.s.job.imbalance < BALANCED]
    keep = balanced if len(chosen) <= 12 else balanced[:max(2, 12 - len(drawn))]
    drawn += keep
    if len(balanced) > len(keep):
        section.notes.append(f"{len(balanced) - len(keep)} more balanced runs (imbalance < {BALANCED}) are in the "
                             f"table but not drawn")
    if len(drawn) > max_runs:
        section.notes.append(f"{len(drawn)} runs to draw; the {max_runs} most imbalanced shown")
        drawn = drawn[:max_runs]
    unit = pick_unit(x.peak_bytes for r in drawn for x in r.measured_ranks())
    height = max(3.0, 0.42 * len(drawn) + 1.6)
    fig, (ax_abs, ax_rel) = plot.plt.subplots(1, 2, figsize=(12, height), sharey=True,
                                              gridspec_kw={"width_ratios": [1.2, 1]})
    rel_top = 1.0
    for row, run in enumerate(drawn):
        y = len(drawn) - 1 - row
        ranks = sorted(run.measured_ranks(), key=lambda x: -x.peak_bytes)
        peaks = [x.peak_bytes for x in ranks]
        mean = statistics.fmean(peaks)
        rel = [p / mean if mean else 0 for p in peaks]
        rel_top = max(rel_top, max(rel))
        for ax, values in ((ax_abs, [unit(p) for p in peaks]), (ax_rel, rel)):
            ax.hlines(y, min(values), max(values), color="#999999", lw=1.5, zorder=2)
            ax.plot(values[1:], [y] * (len(values) - 1), ls="", marker="o", ms=6, color=OKABE_ITO[0],
                    alpha=0.8, zorder=3)
            ax.plot(values[:1], [y], ls="", marker="D", ms=7, color=OKABE_ITO[5], zorder=4)
        ax_abs.plot([unit(mean)], [y], marker="|", ms=14, mew=2, color="#000000", zorder=5)
        ax_rel.annotate(f"{run.s.job.imbalance:.3f}", (max(rel), y), xytext=(6, 0), textcoords="offset points",
                        va="center", fontsize=9)
    if len(drawn) < len(chosen):
        ax_abs.set_title(f"{len(drawn)} of {len(chosen)} runs drawn (all imbalanced ones); all are in the table",
                         fontsize=9, loc="left")
    chosen = drawn
    ax_rel.axvline(1.0, color="#000000", ls="--", lw=1.0)
    ax_abs.set_yticks(range(len(chosen))[::-1], [r.label for r in chosen])
    ax_abs.set_xlabel(f"rank peak ({unit.name})")
    ax_rel.set_xlabel("rank peak / mean rank peak (imbalance = the largest)")
    ax_rel.set_xlim(min(0.8, ax_rel.get_xlim()[0]), rel_top + (rel_top - 0.8) * 0.25 + 0.05)
    left, right = ax_abs.get_xlim()
    ax_abs.set_xlim(0, right * 1.05)
    for ax in (ax_abs, ax_rel):
        ax.set_ylim(-0.7, len(chosen) - 0.3)
        ax.grid(axis="y", alpha=0.0)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="D", ms=7, color=OKABE_ITO[5], label="rank with the highest peak"),
               Line2D([], [], ls="", marker="o", ms=6, color=OKABE_ITO[0], label="other ranks"),
               Line2D([], [], ls="", marker="|", ms=12, mew=2, color="#000000", label="mean rank peak")]
    fig.suptitle("Per-rank peaks, runs sorted by imbalance", x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.06 if len(chosen) > 3 else 0.1, 1, 0.97))
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 0.0))
    files = plot.save(fig, "fig4_imbalance")
    table = md_table(["run", "ranks", "imbalance", "max rank", "max peak (bytes)", "min rank", "min peak (bytes)",
                      "mean peak (bytes)", "peaks by rank (bytes)"], rows)
    section.figures.append(("imbalance", files, table))
    return section


def sort_axis(values: List[Any]) -> List[Any]:
    try:
        return sorted(values, key=lambda v: float(v))
    except (TypeError, ValueError):
        return values


def oom_need(run: Run) -> Optional[float]:
    """Lower bound of the memory the failing rank needed (in use at failure + requested) / capacity."""
    for rank in run.s.per_rank:
        event = rank.oom or {}
        requested = event.get("requested_bytes")
        if requested and rank.capacity_bytes:
            return (oom_in_use(rank) + requested) / rank.capacity_bytes
    return None


def oom_where(run: Run) -> str:
    for rank in run.s.per_rank:
        if rank.oom:
            return f"r{rank.rank} {at(rank.oom.get('step', -1), rank.oom.get('phase', ''))}"
    return ""


def fixed_overrides(sweep: Sweep) -> str:
    """The overrides every point of the sweep shares (its context), e.g. "workload=tiny sharding=table_wise"."""
    parsed = [parse_overrides(p.get("overrides") or []) for p in sweep.points.values()]
    if not parsed:
        return ""
    shared = [f"{k}={v}" for k, v in parsed[0].items() if k not in sweep.varying and all(o.get(k) == v for o in parsed)]
    return " ".join(shared)


def cell_patch(rectangle, x: int, y: int, face: str, hatch_color: str, hatch: str):
    """A hatched heatmap cell with a white border like the others (hatchcolor: matplotlib >= 3.10)."""
    try:
        return rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, edgecolor="white", hatch=hatch,
                         hatchcolor=hatch_color, lw=2, zorder=2)
    except AttributeError:
        return rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, edgecolor=hatch_color, hatch=hatch, lw=0,
                         zorder=2)


def figure_frontier(plot: Plotter, runs: List[Run], sweeps: List[Sweep], max_panels: int = 6) -> Section:
    import numpy as np
    from matplotlib.patches import Patch, Rectangle

    section = Section(5, "OOM frontier",
                      "For each sweep over two or more overrides: the utilization of the busiest rank "
                      "(peak / capacity) at every point; cells that ran out of memory are hatched and give "
                      "where it failed and a lower bound of what the failing rank needed "
                      "(live + requested bytes at the failure, as % of capacity).")
    usable = [s for s in sweeps if len(s.varying) >= 2]
    if not usable:
        if sweeps:
            section.skipped = ("no sweep varies two overrides (found "
                               + "; ".join(f"{s.sweep_id}: {', '.join(s.varying) or 'nothing'} varies" for s in sweeps)
                               + "); run e.g. `membench run -m workload.batch_size=512,4096 workload.rows=10000,200000`")
        else:
            section.skipped = ("no sweep directory (sweep.json) among the inputs; run e.g. "
                               "`membench run -m workload.batch_size=512,4096 workload.rows=10000,200000`")
        return section
    cmap = plot.plt.get_cmap("viridis")
    for index, sweep in enumerate(usable, start=1):
        members = {r.dir.name: r for r in runs if r.sweep is sweep}
        points: Dict[str, Dict[str, Any]] = {}
        for name in sorted(set(members) | set(sweep.points), key=natural_key):
            run = members.get(name)
            overrides = parse_overrides((sweep.points.get(name) or {}).get("overrides") or [])
            value = (lambda k, r=run, o=overrides: o.get(k) if k in o else (r.value(k) if r else None))
            points[name] = {"run": run, "value": value, "status": run.s.status if run else
                            (sweep.points.get(name) or {}).get("status", "missing")}
        x_key, y_key, facet_keys = sweep.varying[1], sweep.varying[0], sweep.varying[2:]

        def axis_values(key: str) -> List[Any]:
            seen: List[Any] = []
            for p in points.values():
                v = p["value"](key)
                if v is not None and hashable(v) not in [hashable(s) for s in seen]:
                    seen.append(v)
            return sort_axis(seen)

        xs, ys = axis_values(x_key), axis_values(y_key)
        facets: List[Tuple[Any, ...]] = []
        for p in points.values():
            combo = tuple(hashable(p["value"](k)) for k in facet_keys)
            if combo not in facets:
                facets.append(combo)
        if len(facets) > max_panels:
            section.notes.append(f"{sweep.sweep_id}: {len(facets)} combinations of {', '.join(facet_keys)}; "
                                 f"the first {max_panels} shown")
            facets = facets[:max_panels]
        ncols = min(len(facets), 3)
        nrows = math.ceil(len(facets) / ncols)
        cell_w = max(1.25, min(1.9, 9.0 / max(len(xs), 1)))
        fig, axes = plot.plt.subplots(nrows, ncols, figsize=(max(5.0, cell_w * len(xs) * ncols + 2.6),
                                                             1.0 * len(ys) * nrows + 1.9 + 0.5 * nrows),
                                      squeeze=False)
        grid_tables = []
        point_rows = []
        statuses_drawn = set()
        image = None
        for f_index, combo in enumerate(facets):
            ax = axes[f_index // ncols, f_index % ncols]
            grid = np.full((len(ys), len(xs)), np.nan)
            cells: Dict[Tuple[int, int], Dict[str, Any]] = {}
            for name, p in points.items():
                if tuple(hashable(p["value"](k)) for k in facet_keys) != combo:
                    continue
                xv, yv = p["value"](x_key), p["value"](y_key)
                if xv is None or yv is None:
                    continue
                i = [hashable(v) for v in ys].index(hashable(yv))
                j = [hashable(v) for v in xs].index(hashable(xv))
                cells[(i, j)] = {**p, "name": name}
                run = p["run"]
                if run is not None and run.s.status == "ok" and run.measured_ranks():
                    grid[i, j] = max(x.utilization for x in run.measured_ranks())
            image = ax.imshow(np.ma.masked_invalid(grid * 100), cmap=cmap, vmin=0, vmax=100, aspect="auto",
                              origin="lower")
            grid_rows = []
            for i, yv in enumerate(ys):
                grid_row = [fmt_value(yv)]
                for j, xv in enumerate(xs):
                    cell = cells.get((i, j))
                    if cell is None:
                        ax.text(j, i, "—", ha="center", va="center", color=STATUS_TEXT_COLOR, fontsize=9)
                        grid_row.append("—")
                        continue
                    run, status = cell["run"], cell["status"]
                    statuses_drawn.add(status)
                    if status == "ok" and not math.isnan(grid[i, j]):
                        value = grid[i, j]
                        ax.text(j, i, f"{value * 100:.1f}%", ha="center", va="center", fontsize=9.5,
                                color="white" if value < 0.6 else "black", fontweight="bold")
                        grid_row.append(f"{pct(value)} %")
                    elif status == "oom":
                        ax.add_patch(cell_patch(Rectangle, j, i, "#F4D6C6", OOM_FACE, "///"))
                        need = oom_need(run) if run else None
                        where_ = oom_where(run) if run else ""
                        text = "OOM" + (f"\n{where_}" if where_ else "") + (f"\nneeds ≥{need * 100:.1f}%" if need else "")
                        ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black", zorder=3,
                                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
                        grid_row.append("OOM" + (f" ({where_}; needs ≥ {pct(need)} %)" if need else ""))
                    else:
                        ax.add_patch(cell_patch(Rectangle, j, i, "#EEEEEE", "#999999", ".."))
                        ax.text(j, i, status, ha="center", va="center", fontsize=9, zorder=3)
                        grid_row.append(status)
                    peak = max((x.peak_bytes for x in run.measured_ranks()), default=None) if run else None
                    cap = run.s.per_rank[0].capacity_bytes if run and run.s.per_rank else None
                    point_rows.append([cell["name"], *[fmt_value(cell["value"](k)) for k in facet_keys],
                                       fmt_value(cell["value"](y_key)), fmt_value(cell["value"](x_key)), status,
                                       peak if status == "ok" else "—", cap if cap is not None else "—",
                                       pct(grid[i, j]) if status == "ok" and not math.isnan(grid[i, j]) else "—"])
                grid_rows.append(grid_row)
            ax.set_xticks(range(len(xs)), [fmt_value(v) for v in xs])
            ax.set_yticks(range(len(ys)), [fmt_value(v) for v in ys])
            ax.set_xlabel(x_key)
            ax.set_ylabel(y_key)
            ax.grid(False)
            for spine in ax.spines.values():
                spine.set_visible(False)
            ax.set_xticks(np.arange(-0.5, len(xs), 1), minor=True)
            ax.set_yticks(np.arange(-0.5, len(ys), 1), minor=True)
            ax.grid(which="minor", color="white", lw=2)
            ax.tick_params(which="minor", length=0)
            facet_text = ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(facet_keys, combo))
            if facet_text:
                ax.set_title(facet_text, fontsize=10, loc="left")
            grid_tables.append((facet_text, md_table([f"{y_key} \\ {x_key}", *[fmt_value(v) for v in xs]],
                                                     grid_rows)))
        for f_index in range(len(facets), nrows * ncols):
            axes[f_index // ncols, f_index % ncols].set_visible(False)
        fixed = fixed_overrides(sweep)
        fig.suptitle(f"OOM frontier: {sweep.sweep_id}\nbusiest-rank utilization (%) over {y_key} × {x_key}"
                     + (f"\nfixed: {fixed}" if fixed else ""), x=0.01, ha="left", fontsize=12)
        fig.tight_layout(rect=(0, 0.1, 0.88, 1))
        cax = fig.add_axes((0.9, 0.2, 0.022, 0.65))
        bar = fig.colorbar(image, cax=cax)
        bar.set_label("peak / capacity of the busiest rank (%)")
        handles = []
        if "oom" in statuses_drawn:
            handles.append(Patch(facecolor="#F4D6C6", edgecolor=OOM_FACE, hatch="///", label="out of memory"))
        if statuses_drawn - {"ok", "oom"}:
            handles.append(Patch(facecolor="#EEEEEE", edgecolor="#999999", hatch="..",
                                 label="/".join(sorted(statuses_drawn - {"ok", "oom"}))))
        if handles:
            fig.legend(handles=handles, loc="lower left", ncol=2, frameon=False, bbox_to_anchor=(0.01, 0.0))
        files = plot.save(fig, f"fig5_oom_frontier_{index}")
        tables = "\n\n".join((f"*{facet}*\n\n" if facet else "") + table for facet, table in grid_tables)
        tables += "\n\n" + md_table(["point", *facet_keys, y_key, x_key, "status", "busiest peak (bytes)",
                                     "capacity (bytes)", "busiest utilization %"], point_rows)
        section.figures.append((f"sweep `{sweep.sweep_id}` (`{sweep.dir}`)", files, tables))
    one_d = [s for s in sweeps if len(s.varying) < 2]
    if one_d:
        section.notes.append("not a 2-D sweep, no frontier: " + ", ".join(s.sweep_id for s in one_d))
    return section


def estimate_points(runs: List[Run]) -> List[Dict[str, Any]]:
    points = []
    for run in runs:
        est = run.s.estimate
        if run.s.mode == "plan" or not isinstance(est, dict):
            continue
        ours = est.get("per_rank_peak") or []
        theirs = est.get("torchrec_per_rank_peak") or []
        if not ours and not theirs:
            continue
        for rank in run.measured_ranks():
            def pick(values: Any, r: int = rank.rank) -> Any:
                return values[r] if isinstance(values, list) and r < len(values) else None

            point = {"run": run, "rank": rank.rank, "measured": rank.peak_bytes,
                     "membench": pick(ours), "membench_err": pick(est.get("error_pct")),
                     "torchrec": pick(theirs), "torchrec_err": pick(est.get("torchrec_error_pct"))}
            if point["membench"] is not None or point["torchrec"] is not None:
                points.append(point)
    return points


def fmt_err(value: Any) -> str:
    return "—" if value is None else f"{float(value):+.2f}"


def figure_estimate(plot: Plotter, runs: List[Run]) -> Section:
    import numpy as np

    section = Section(6, "Estimated vs measured peak",
                      "Per rank of each finished measured run: the estimated peak (membench's estimator and "
                      "torchrec's planner, from `estimate` in summary.json) against the measured one. "
                      "Shaded: within ±10 % and ±25 % of y = x. Error % as stored in the summary "
                      "(estimate − measured) / measured.")
    points = estimate_points(runs)
    if not points:
        section.skipped = ("no measured run carries an estimate (`estimate.per_rank_peak` in summary.json is "
                           "empty or null); runs record one once the estimator is enabled for training runs")
        return section
    series = [("membench", "membench estimate", "o", OKABE_ITO[0]), ("torchrec", "torchrec planner", "^", OKABE_ITO[1])]
    all_values = [p["measured"] for p in points] + [p[k] for p in points for k, *_ in series if p[k] is not None]
    unit = pick_unit(all_values)
    low, high = min(all_values), max(all_values)
    log = high / max(low, 1) > 20
    fig, ax = plot.plt.subplots(figsize=(7.2, 6.4))
    lo, hi = (low / 1.4, high * 1.4) if log else (0, high * 1.12)
    grid = np.geomspace(max(lo, 1), hi, 200) if log else np.linspace(lo, hi, 200)
    g = grid / unit.scale
    ax.fill_between(g, g * 0.75, g * 1.25, color="#999999", alpha=0.15, lw=0, label="±25 %")
    ax.fill_between(g, g * 0.9, g * 1.1, color="#999999", alpha=0.3, lw=0, label="±10 %")
    ax.plot(g, g, color="#000000", lw=1.0, ls="--", label="y = x")
    summary_rows = []
    for key, name, marker, color in series:
        chosen = [p for p in points if p[key] is not None]
        if not chosen:
            continue
        ax.scatter([unit(p["measured"]) for p in chosen], [unit(p[key]) for p in chosen], marker=marker, s=42,
                   color=color, edgecolor="black", linewidth=0.5, label=f"{name} (n={len(chosen)})", zorder=4,
                   alpha=0.9)
        counts: Dict[Tuple[int, int], int] = {}
        for p in chosen:
            counts[(p["measured"], p[key])] = counts.get((p["measured"], p[key]), 0) + 1
        for (measured, estimated), count in sorted(counts.items()):
            if count > 1:
                ax.annotate(f"×{count}", (unit(measured), unit(estimated)), xytext=(7, -3),
                            textcoords="offset points", fontsize=8, color=color if key == "membench" else "#8A5A00")
        errors = [abs(float(p[f"{key}_err"])) for p in chosen if p[f"{key}_err"] is not None]
        if errors:
            summary_rows.append([name, len(chosen), f"{statistics.fmean(errors):.2f}", f"{max(errors):.2f}",
                                 sum(1 for e in errors if e <= 10)])
    if log:
        from matplotlib.ticker import FuncFormatter, LogLocator

        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlim(lo / unit.scale, hi / unit.scale)
    ax.set_ylim(lo / unit.scale, hi / unit.scale)
    ax.set_aspect("equal", adjustable="box")
    scale_note = ", log scale" if log else ""
    ax.set_xlabel(f"measured peak ({unit.name}{scale_note})")
    ax.set_ylabel(f"estimated peak ({unit.name}{scale_note})")
    ax.set_title("Estimated vs measured peak per rank", loc="left")
    if any(v > 1 for v in (sum(1 for q in points if (q["measured"], q["membench"]) == (p["measured"], p["membench"]))
                           for p in points)):
        ax.text(0.98, 0.02, "×n: n ranks at the same point", transform=ax.transAxes, ha="right", va="bottom",
                fontsize=8, color="#555555")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    files = plot.save(fig, "fig6_estimate_vs_measured")
    rows = [[p["run"].label, p["rank"], unit.fmt(p["measured"]), p["measured"],
             p["membench"] if p["membench"] is not None else "—", fmt_err(p["membench_err"]),
             p["torchrec"] if p["torchrec"] is not None else "—", fmt_err(p["torchrec_err"])] for p in points]
    table = md_table(["run", "rank", f"measured ({unit.name})", "measured (bytes)", "membench estimate (bytes)",
                      "membench error %", "torchrec estimate (bytes)", "torchrec error %"], rows)
    if summary_rows:
        table = md_table(["estimator", "points", "mean abs error %", "max abs error %", "within ±10 %"],
                         summary_rows) + "\n\n" + table
    section.figures.append(("estimate vs measured", files, table))
    return section


def figure_plan(plot: Plotter, runs: List[Run]) -> Section:
    import numpy as np

    section = Section(7, "Plan mode at scale",
                      "Estimated per-rank utilization (planned peak / capacity) of the virtual workloads across "
                      "world sizes, from plan-mode summaries. Dots: ranks; bar: min–max; diamond: the worst "
                      "rank. Above the 100 % line a rank does not fit.")
    plans = [r for r in runs if r.s.mode == "plan"]
    if not plans:
        section.skipped = ("no plan-mode summary (mode \"plan\"); produce them with "
                           "`membench plan workload=tb_1 hardware=h100_80g world_size=64`")
        return section
    groups: Dict[Tuple[str, str], List[Run]] = {}
    for run in plans:
        groups.setdefault((run.s.workload, run.s.hardware), []).append(run)
    keys = sorted(groups, key=lambda k: (natural_key(k[0]), k[1]))
    ncols = min(len(keys), 3)
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plot.plt.subplots(nrows, ncols, figsize=(4.4 * ncols + 0.6, 4.0 * nrows + 0.8), squeeze=False)
    rows = []
    rng = np.random.default_rng(0)
    unplaced_any = False
    for index, key in enumerate(keys):
        ax = axes[index // ncols, index % ncols]
        members = sorted(groups[key], key=lambda r: (r.s.world_size, natural_key(str(r.dir))))
        sizes = []
        for run in members:
            if run.s.world_size not in sizes:
                sizes.append(run.s.world_size)
        top = max([1.0] + [rank.utilization for run in members for rank in run.s.per_rank])
        low = min([1.0] + [rank.utilization for run in members for rank in run.s.per_rank if rank.utilization > 0])
        log = top / max(low, 1e-9) > 8 and top > 2.0
        for run in members:
            x = sizes.index(run.s.world_size)
            est = run.s.estimate if isinstance(run.s.estimate, dict) else {}
            verdict = est.get("verdict") or ("fits" if run.s.status == "ok" else run.s.status)
            fits = verdict == "fits"
            color = OKABE_ITO[0] if fits else OKABE_ITO[5]
            plan_time = f"{est.get('plan_time_s'):.3f}" if isinstance(est.get("plan_time_s"), (int, float)) else "—"
            if not run.s.per_rank:
                # no placement at all (e.g. the tables exceed the total capacity): nothing per rank to draw
                unplaced_any = True
                y = top * 100 * (1.6 if log else 1.07)
                ax.plot([x], [y], marker="X", ms=11, color=OOM_FACE, mec="black", mew=0.6, zorder=4)
                ax.annotate(f"{verdict.upper()}:\nno placement", (x, y), xytext=(0, -10), textcoords="offset points",
                            ha="center", va="top", fontsize=8.5, fontweight="bold", zorder=5,
                            bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.9))
                rows.append([run.s.workload, run.s.hardware, run.s.world_size, verdict, "—", "—", "—", "—", "—",
                             "—", "—", plan_time, run.s.error or ""])
                continue
            utils = [rank.utilization for rank in run.s.per_rank]
            jitter = rng.uniform(-0.18, 0.18, len(utils))
            ax.scatter(x + jitter, [u * 100 for u in utils], s=9, color=color, alpha=0.45, lw=0, zorder=3,
                       rasterized=len(utils) > 256)  # thousands of ranks: keep the SVG small
            ax.vlines(x, min(utils) * 100, max(utils) * 100, color=color, lw=2.0, zorder=2)
            worst = est.get("worst_rank")
            worst_rank = next((r for r in run.s.per_rank if r.rank == worst), None) or \
                max(run.s.per_rank, key=lambda r: r.utilization)
            ax.plot([x], [worst_rank.utilization * 100], marker="D", ms=8, color=color, mec="black", mew=0.6,
                    zorder=4)
            ax.annotate(f"{verdict.upper() if not fits else 'fits'}\n{pct(worst_rank.utilization, 1)} %",
                        (x, worst_rank.utilization * 100), xytext=(0, 8), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8.5, color="black",
                        fontweight="bold" if not fits else "normal")
            peak = max(r.peak_bytes for r in run.s.per_rank)
            rows.append([run.s.workload, run.s.hardware, run.s.world_size, verdict, worst_rank.rank,
                         pct(min(utils)), pct(statistics.fmean(utils)), pct(max(utils)), peak,
                         f"{peak / GIB:.3f}", worst_rank.capacity_bytes, plan_time, run.s.error or ""])
        ax.axhline(100, color="#000000", ls="--", lw=1.1)
        if log:
            ax.set_yscale("log")
            ax.set_ylim(low * 100 / 1.6, top * 100 * 2.6)
            ax.set_ylabel("estimated utilization (%, log scale)")
        else:
            ax.set_ylim(0, max(118, top * 100 * 1.22))
            ax.set_ylabel("estimated utilization (%)")
        ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
        ax.set_xlim(-0.6, len(sizes) - 0.4)
        ax.set_xlabel("world size (ranks)")
        ax.set_title(f"{key[0]} on {key[1]}", fontsize=10.5, loc="left")
        ax.grid(axis="x", alpha=0.0)
    for index in range(len(keys), nrows * ncols):
        axes[index // ncols, index % ncols].set_visible(False)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color=OKABE_ITO[0], label="ranks (fits)"),
               Line2D([], [], ls="", marker="o", color=OKABE_ITO[5], label="ranks (does not fit)"),
               Line2D([], [], ls="", marker="D", color="#777777", mec="black", label="worst rank"),
               Line2D([], [], ls="--", color="#000000", lw=1.1, label="capacity (100 %)")]
    if unplaced_any:
        handles.append(Line2D([], [], ls="", marker="X", color=OOM_FACE, mec="black", label="no placement possible"))
    fig.suptitle("Plan mode: estimated per-rank utilization vs world size", x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, bbox_to_anchor=(0.5, 0.0))
    files = plot.save(fig, "fig7_plan_scale")
    table = md_table(["workload", "hardware", "world size", "verdict", "worst rank", "util min %", "util mean %",
                      "util max %", "max rank peak (bytes)", "max rank peak (GiB)", "capacity (bytes)",
                      "plan time s", "error"], rows)
    section.figures.append(("plan mode at scale", files, table))
    return section


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def runs_table(runs: List[Run]) -> str:
    rows = []
    for run in runs:
        ranks = run.s.per_rank
        peak = max((r.peak_bytes for r in ranks), default=None)
        util = max((r.utilization for r in ranks), default=None)
        rows.append([run.label, run.s.run_id, run.s.mode, run.s.status, run.s.workload, run.s.hardware,
                     run.s.world_size, peak if peak is not None else "—", pct(util),
                     f"{run.s.job.imbalance:.4f}" if run.s.status == "ok" and run.s.mode != "plan" else "—"])
    return md_table(["label", "run id", "mode", "status", "workload", "hardware", "world size",
                     "max rank peak (bytes)", "max rank utilization %", "imbalance"], rows)


def oom_table(runs: List[Run]) -> Optional[str]:
    rows = []
    for run in runs:
        if run.s.mode == "plan":
            continue
        for rank in run.s.per_rank:
            if rank.oom:
                event = rank.oom
                stats = event.get("stats") or {}
                rows.append([run.label, rank.rank, event.get("step", "—"), event.get("phase", "—"),
                             event.get("requested_bytes", "—"), stats.get("live_bytes", "—"), rank.capacity_bytes,
                             rank.peak_bytes])
        if run.s.status in ("failed", "timeout", "invalid"):
            rows.append([run.label, "—", "—", run.s.status, "—", "—", "—", run.s.error or ""])
    if not rows:
        return None
    return md_table(["run", "rank", "step", "phase / status", "requested (bytes)", "live at failure (bytes)",
                     "capacity (bytes)", "peak reached (bytes) / error"], rows)


def relative(path: Path, base: Path) -> str:
    try:
        return os.path.relpath(path, base)
    except ValueError:
        return str(path)


def render_markdown(out: Path, inputs: Sequence[Path], runs: List[Run], sections: List[Section],
                    warnings: List[str]) -> str:
    counts: Dict[str, int] = {}
    for run in runs:
        counts[run.s.status] = counts.get(run.s.status, 0) + 1
    modes = {}
    for run in runs:
        modes[run.s.mode] = modes.get(run.s.mode, 0) + 1
    lines = ["# membench report", "",
             f"{len(runs)} runs ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}; "
             f"{', '.join(f'{v} {k}' for k, v in sorted(modes.items()))} mode) from "
             + ", ".join(f"`{p}`" for p in inputs) + ".", "",
             "Memory is in the unit named in each column (3 decimals) and in raw bytes; utilization = peak / "
             "capacity, in %. Numbers come from the runs' summary.json unchanged. Figures use colour-blind-safe "
             "palettes (Okabe-Ito, Paul Tol muted, viridis).", ""]
    lines += ["## Contents", ""]
    for section in sections:
        state = "" if not section.skipped else " (skipped)"
        lines.append(f"{section.number}. [{section.title}](#{section.number}-{slug(section.title)}){state}")
    lines += ["", "## Runs", "", runs_table(runs), ""]
    for section in sections:
        lines += [f"## {section.number}. {section.title}", ""]
        if section.skipped:
            lines += [f"Skipped: {section.skipped}.", ""]
            continue
        if section.intro:
            lines += [section.intro, ""]
        for caption, files, table in section.figures:
            image = next((f for f in files if f.suffix == ".png"), files[0] if files else None)
            others = ", ".join(f"[{f.suffix[1:]}]({relative(f, out)})" for f in files if f is not image)
            lines += [f"**{caption}**", ""]
            if image is not None:
                lines += [f"![{md_escape(caption)}]({relative(image, out)})", ""]
            if others:
                lines += [f"Also as {others}.", ""]
            lines += [table, ""]
        for note in section.notes:
            lines += [f"- {note}"]
        if section.notes:
            lines.append("")
    oom = oom_table(runs)
    lines += ["## OOM and failed runs", ""]
    lines += [oom, ""] if oom else ["None.", ""]
    if warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in warnings] + [""]
    return "\n".join(lines)


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).strip().replace(" ", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Figures and a markdown report (report.md) from membench results.",
        epilog="examples:\n  membench report results/runs/sweep-20261202-150211-e51851\n"
               "  membench report results/runs --out docs/report --format png\n\n"
               "exit status: 0 report written, 2 no readable summary.json (or bad arguments)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, sweep directories or results roots (searched for summary.json)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory (default: <path>/report for one path, ./report for several)")
    parser.add_argument("--format", default="png,svg",
                        help=f"comma-separated figure formats among {', '.join(FORMATS)} (default png,svg)")
    return parser


def clean_old_figures(out: Path) -> None:
    for path in out.glob("fig[0-9]_*"):
        if path.is_file() and path.suffix[1:] in FORMATS:
            path.unlink()


class WarningLog:
    """Collects the warnings printed on stderr so report.md lists them too."""

    def __init__(self):
        self.items: List[str] = []

    def __enter__(self):
        global warn
        self._previous = warn

        def capture(message: str) -> None:
            self.items.append(message)
            self._previous(message)

        warn = capture
        return self

    def __exit__(self, *exc):
        global warn
        warn = self._previous


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    formats = [f.strip().lower().lstrip(".") for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        print(f"{PROG}: --format {args.format!r}: use a comma-separated list of {', '.join(FORMATS)}",
              file=sys.stderr)
        return EXIT_NO_RESULTS
    out = args.out if args.out is not None else (args.paths[0] / "report" if len(args.paths) == 1
                                                 and args.paths[0].is_dir() else Path("report"))
    with WarningLog() as log:
        try:
            runs, sweeps = load_runs(args.paths, skip=out.resolve())
        except NoResults as err:
            print(str(err), file=sys.stderr)
            return EXIT_NO_RESULTS
        info(f"{len(runs)} runs loaded ({len(sweeps)} sweeps) from {', '.join(map(str, args.paths))}")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            print(f"{PROG}: cannot create {out} ({err.strerror or err})", file=sys.stderr)
            return EXIT_NO_RESULTS
        clean_old_figures(out)
        plot = Plotter(out, formats)
        builders = [
            ("memory timelines", lambda: figure_timeline(plot, runs)),
            ("breakdown at peak", lambda: figure_breakdown(plot, runs)),
            ("utilization CDF", lambda: figure_utilization(plot, runs)),
            ("imbalance", lambda: figure_imbalance(plot, runs)),
            ("OOM frontier", lambda: figure_frontier(plot, runs, sweeps)),
            ("estimated vs measured", lambda: figure_estimate(plot, runs)),
            ("plan mode at scale", lambda: figure_plan(plot, runs)),
        ]
        sections = []
        for number, (name, build) in enumerate(builders, start=1):
            info(f"figure {number}/{len(builders)}: {name}")
            section = build()
            if section.skipped:
                info(f"  skipped: {section.skipped}")
            sections.append(section)
        text = render_markdown(out, args.paths, runs, sections, log.items)
    atomic_write_text(out / "report.md", text)
    made = sum(len(files) for s in sections for _, files, _ in s.figures)
    print(f"report: {out / 'report.md'} ({made} figure files, "
          f"{sum(1 for s in sections if s.skipped)} of {len(sections)} figures skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
