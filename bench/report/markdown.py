"""report.md: the sections the figures fill in, markdown tables, and the document around them."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.report.loading import Run
from bench.report.style import pct

PREFACE = ("Memory is in the unit named in each column (3 decimals) and in raw bytes; utilization = peak / "
           "capacity, in %. Numbers come from the runs' summary.json unchanged. Figures use colour-blind-safe "
           "palettes (Okabe-Ito, Paul Tol muted, viridis).")


@dataclass
class Section:
    number: int
    title: str
    intro: str = ""
    figures: List[Tuple[str, List[Path], str]] = field(default_factory=list)  # (caption, files, table md)
    skipped: Optional[str] = None
    notes: List[str] = field(default_factory=list)


def md_escape(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(md_escape(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


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
    except ValueError:  # another drive (Windows): no relative path exists
        return str(path)


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).strip().replace(" ", "-")


def count_by(values: List[str]) -> str:
    counts: Dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))


def heading_lines(inputs: Sequence[Path], runs: List[Run], sections: List[Section]) -> List[str]:
    counted = (f"{len(runs)} runs ({count_by([run.s.status for run in runs])}; "
               f"{count_by([run.s.mode for run in runs])} mode)" if runs else "No runs (provision reports only)")
    lines = ["# membench report", "", f"{counted} from " + ", ".join(f"`{p}`" for p in inputs) + ".", "",
             PREFACE, ""]
    lines += ["## Contents", ""]
    for section in sections:
        state = "" if not section.skipped else " (skipped)"
        lines.append(f"{section.number}. [{section.title}](#{section.number}-{slug(section.title)}){state}")
    return lines


def figure_lines(out: Path, caption: str, files: List[Path], table: str) -> List[str]:
    image = next((f for f in files if f.suffix == ".png"), files[0] if files else None)
    others = ", ".join(f"[{f.suffix[1:]}]({relative(f, out)})" for f in files if f is not image)
    lines = [f"**{caption}**", ""]
    if image is not None:
        lines += [f"![{md_escape(caption)}]({relative(image, out)})", ""]
    if others:
        lines += [f"Also as {others}.", ""]
    return lines + [table, ""]


def section_lines(out: Path, section: Section) -> List[str]:
    lines = [f"## {section.number}. {section.title}", ""]
    if section.skipped:
        return lines + [f"Skipped: {section.skipped}.", ""]
    if section.intro:
        lines += [section.intro, ""]
    for caption, files, table in section.figures:
        lines += figure_lines(out, caption, files, table)
    lines += [f"- {note}" for note in section.notes]
    if section.notes:
        lines.append("")
    return lines


def render_markdown(out: Path, inputs: Sequence[Path], runs: List[Run], sections: List[Section],
                    warnings: List[str]) -> str:
    lines = heading_lines(inputs, runs, sections)
    lines += ["", "## Runs", "", runs_table(runs), ""]
    for section in sections:
        lines += section_lines(out, section)
    oom = oom_table(runs)
    lines += ["## OOM and failed runs", ""]
    lines += [oom, ""] if oom else ["None.", ""]
    if warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in warnings] + [""]
    return "\n".join(lines)
