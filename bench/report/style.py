"""How the report looks: colours, units, short names of config keys, matplotlib set-up and saving."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, List, Optional, Sequence

from workloads.units import GIB, MIB

FORMATS = ("png", "svg", "pdf")
SAVE_DPI = 150
BALANCED = 1.001  # imbalance below this counts as balanced (figure 4 draws only a few of those)

# Okabe & Ito (2008): distinguishable with every common colour-vision deficiency.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
PHASE_COLORS = MappingProxyType({"build": "#BBBBBB", "input": "#F0E442", "forward": "#56B4E9",
                                 "backward": "#E69F00", "optimizer": "#009E73"})
# Paul Tol's "muted" scheme (colour-blind safe), one fixed colour per breakdown category.
CATEGORY_COLORS = MappingProxyType({
    "embedding_weights": "#332288", "embedding_optimizer": "#88CCEE", "embedding_grads": "#44AA99",
    "embedding_cache": "#6699CC", "embedding_cache_state": "#AADDEE",
    "dense_params": "#117733", "dense_grads": "#999933", "dense_optimizer": "#DDCC77",
    "activations": "#CC6677", "comm_buffers": "#882255", "inputs_in_flight": "#661100",
    "allocator_overhead": "#AA4499",
    "non_torch": "#555555", "other": "#DDDDDD",
})
STATUS_TEXT_COLOR = "#333333"
OOM_FACE = "#D55E00"

# Short names of config keys in labels; group selections (workload=small) show only their value.
SHORT_KEYS = MappingProxyType({
    "workload.batch_size": "batch", "workload.global_batch_size": "global batch", "workload.rows": "rows",
    "workload.num_tables": "tables", "workload.embedding_dim": "dim", "hardware.capacity_gib": "capacity GiB",
    "world_size": "world", "workload.rows_max": "rows max", "workload.rows_min": "rows min",
    "workload.ids.zipf_alpha": "zipf", "workload.pooling.mean": "pooling",
})
GROUP_KEYS = ("mode", "workload", "sharding", "hardware", "model", "record")


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


def at(step: int, phase: str) -> str:
    if step is None or step < 0:
        return phase or "build"
    return f"step {step} {phase}".strip()


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


class Plotter:
    """Figure set-up and saving for one report directory; matplotlib is imported only when a report is made."""

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
            # fixed SVG ids (and no dates in save): the same results give byte-identical figures
            "svg.hashsalt": "membench", "savefig.bbox": "tight", "savefig.pad_inches": 0.15,
        })

    def save(self, fig, stem: str) -> List[Path]:
        paths = []
        # "tight" lays the figure out once per save to find its box: found once here, at the saving dpi (text
        # extents depend on it), and every format reuses it
        fig.set_dpi(SAVE_DPI)
        box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(self.plt.rcParams["savefig.pad_inches"])
        for fmt in self.formats:
            path = self.out / f"{stem}.{fmt}"
            metadata = {"Date": None} if fmt in ("svg", "pdf") else {"Software": None}
            fig.savefig(path, dpi=SAVE_DPI, metadata=metadata, bbox_inches=box)
            paths.append(path)
        self.plt.close(fig)
        return paths
