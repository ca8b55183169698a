"""Ids of a synthetic batch: which rows of a table its samples look up.

1. ids over the table's VIRTUAL id space ``[0, virtual_rows)`` (``draw_virtual_ids``): uniform, or the
   bounded Zipf law of workloads.zipf_law, drawn by workloads.zipf_alias's sampler -- nothing of size
   ``virtual_rows`` is allocated, so virtual spaces of 1e10+ rows are fine;
2. virtual -> PHYSICAL row (``to_physical``): identity when the table is materialized in full, else a
   splitmix64 hash modulo ``physical_rows``.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional, Sequence

import numpy as np

from workloads.config import IdsConfig
from workloads.hashing import splitmix64, umod_inplace
from workloads.zipf_alias import draw_alias, zipf_alias
from workloads.zipf_law import check_zipf_args

# ids (in one draw, or in one batch's Zipf tables together) from which the compiled sampler is used: below, numpy
# passes, whose fixed cost per call is lower, and which need no numba (0.3 s to import, 0.25 s to load the
# cached loop, 2 s to compile it the first time)
COMPILED_MIN_IDS = 1 << 17


@lru_cache(maxsize=1)
def compiled_alias_draw() -> Optional[Callable]:
    """workloads.alias_kernel's compiled sampler, or None without numba."""
    try:
        from workloads.alias_kernel import alias_draw
    except ImportError:
        return None
    return alias_draw


def zipf_key(rng: np.random.Generator) -> int:
    """A table's Zipf draw is keyed by one 64-bit word of its generator: its uniforms come from the SplitMix64
    stream of that key (workloads.hashing.splitmix_word), which the compiled loop makes in place."""
    return int(rng.bit_generator.random_raw())


def draw_zipf_grouped(alpha: float, n_ranks: int, keys: Sequence[int], counts: Sequence[int], out: np.ndarray,
                      as_ids: bool = True, compiled: bool = True, starts: Optional[Sequence[int]] = None) -> None:
    """Zipf ids (or ranks) for several tables of the same (alpha, n_ranks), into ``out`` (int64).

    Table ``i`` draws ``counts[i]`` values keyed by ``keys[i]`` (`zipf_key`) into ``out[starts[i] : starts[i] +
    counts[i]]`` (``starts``: by default the tables one after the other from 0). Table ``i`` gets exactly what it
    draws alone: grouping changes the speed only. The draws are workloads.zipf_alias's: in one compiled pass
    when ``compiled`` (and numba is there), else by numpy passes; the values are the same.
    """
    if starts is None:
        starts = np.cumsum([0, *counts[:-1]], dtype=np.int64) if len(counts) else []
    if not sum(counts):
        return
    tab = zipf_alias(float(alpha), int(n_ranks))
    kernel = compiled_alias_draw() if compiled else None
    if kernel is None:
        draw_alias(tab, keys, starts, counts, out, as_ids)
        return
    kernel(np.array(keys, dtype=np.uint64), np.array(starts, dtype=np.int64), np.array(counts, dtype=np.int64),
           tab.cell_shift, tab.cells, tab.singles, tab.single_ids if as_ids else tab.single_ranks, tab.wide, tab.b,
           tab.log_form, as_ids, np.int64(n_ranks), np.int64(tab.multiplier), out)


def _draw_zipf(rng: np.random.Generator, alpha: float, n_ranks: int, n: int, as_ids: bool,
               out: Optional[np.ndarray]) -> np.ndarray:
    """``n`` Zipf ranks (or ids) from ``rng`` into ``out`` (a new array if None): `zipf_key`, then
    ``draw_zipf_grouped`` for this one table."""
    if out is None:
        out = np.empty(n, dtype=np.int64)
    elif out.shape != (n,) or out.dtype != np.int64:
        raise ValueError(f"out must be an int64 array of shape ({n},), got {out.dtype} {out.shape}")
    draw_zipf_grouped(alpha, n_ranks, [zipf_key(rng)], [n], out, as_ids, compiled=n >= COMPILED_MIN_IDS)
    return out


def draw_zipf_ranks(rng: np.random.Generator, alpha: float, n_ranks: int, n: int) -> np.ndarray:
    """``n`` popularity ranks in ``[1, n_ranks]`` of workloads.zipf_law's law (int64), any ``alpha > 0``."""
    check_zipf_args(alpha, n_ranks)
    return _draw_zipf(rng, float(alpha), int(n_ranks), int(n), as_ids=False, out=None)


def draw_virtual_ids(rng: np.random.Generator, ids_cfg: IdsConfig, virtual_rows: int, n: int,
                     out: Optional[np.ndarray] = None) -> np.ndarray:
    """``n`` ids in ``[0, virtual_rows)`` (int64): ``uniform``, or ``zipf`` with ``ids_cfg.zipf_alpha``.

    ``out``: an int64 array of shape ``(n,)`` to draw into (returned), instead of a new one.
    """
    virtual_rows = int(virtual_rows)
    if virtual_rows < 1:
        raise ValueError(f"virtual_rows must be >= 1, got {virtual_rows}")
    dist = ids_cfg.distribution
    if dist == "uniform":
        ids = rng.integers(0, virtual_rows, size=n, dtype=np.int64)
        if out is None:
            return ids
        out[...] = ids
        return out
    if dist == "zipf":
        alpha = float(ids_cfg.zipf_alpha)
        check_zipf_args(alpha, virtual_rows)
        return _draw_zipf(rng, alpha, virtual_rows, int(n), as_ids=True, out=out)
    raise ValueError(f"unknown ids distribution {dist!r} (uniform | zipf)")


def to_physical(virtual_ids: np.ndarray, virtual_rows: int, physical_rows: int) -> np.ndarray:
    """Map virtual ids to physical rows in ``[0, physical_rows)`` (int64).

    Identity when ``physical_rows == virtual_rows`` (table materialized in full), else
    ``splitmix64(id) mod physical_rows``. ``physical_rows == 0`` means the table is not materialized
    (``materialize=plan_only``): there is no row to look up, so this raises ``ValueError``.
    """
    physical_rows = int(physical_rows)
    if physical_rows <= 0:
        raise ValueError(
            f"table has physical_rows={physical_rows}: it is not materialized (materialize=plan_only?), "
            "so ids cannot be mapped to rows; synthetic batches need materialize=full or scaled"
        )
    if physical_rows == int(virtual_rows):
        return np.asarray(virtual_ids, dtype=np.int64)
    h = splitmix64(virtual_ids)
    umod_inplace(h, physical_rows)
    return h.view(np.int64)
