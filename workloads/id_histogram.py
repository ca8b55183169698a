"""Ids drawn from a histogram of bucket weights over a table's popularity ranks (a tables file's
``id_histogram`` column: workloads.tables_file).

The ranks ``0 .. rows-1`` are cut into K near-equal buckets (bucket j holds ``[j*rows//K, (j+1)*rows//K)``,
bucket 0 the most popular); an id falls in bucket j with probability ``w_j / sum(w)``, uniformly within it,
and ranks are scattered over the id space as Zipf ranks are (``workloads.zipf_law.zipf_rank_to_id``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Tuple

import numpy as np

from workloads.config import IdsConfig
from workloads.rules import HISTOGRAM
from workloads.zipf_law import zipf_multiplier, zipf_rank_to_id


@dataclass
class HistogramIdsConfig(IdsConfig):
    """A table's ids drawn from a histogram of bucket weights over equal-width popularity-rank buckets."""

    distribution: str = HISTOGRAM
    histogram: Tuple[float, ...] = ()


@lru_cache(maxsize=256)
def _histogram_buckets(weights: Tuple[float, ...], virtual_rows: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cdf, first rank, width) of each bucket."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    cdf /= cdf[-1]
    bounds = _bucket_bounds(virtual_rows, len(weights))
    return cdf, bounds[:-1], np.diff(bounds)


def _bucket_bounds(virtual_rows: int, buckets: int) -> np.ndarray:
    """The first rank (0-based) of each of ``buckets`` near-equal buckets of ranks, then ``virtual_rows``."""
    return np.array([j * virtual_rows // buckets for j in range(buckets + 1)], dtype=np.int64)


def has_id_histograms(tables) -> bool:
    """Does any of these tables (TableSpec or FileTable) draw its ids from a histogram (host generator only)?"""
    return any(t.ids.distribution == HISTOGRAM for t in tables)


def draw_histogram_ids(rng: np.random.Generator, ids_cfg: HistogramIdsConfig, virtual_rows: int,
                       n: int) -> np.ndarray:
    """``n`` ids in ``[0, virtual_rows)`` (int64) whose popularity ranks follow ``ids_cfg.histogram``.

    Per id: one uniform picks the bucket by inverse CDF (a zero-weight bucket is never picked), one
    integer the rank within it; ranks are scattered over the id space by ``zipf_rank_to_id``, as Zipf
    ranks are. Same signature as ``workloads.ids.draw_virtual_ids``.
    """
    virtual_rows = int(virtual_rows)
    weights = tuple(float(w) for w in ids_cfg.histogram)
    if not weights or len(weights) > virtual_rows or not sum(weights) > 0 or min(weights) < 0:
        raise ValueError(f"a histogram needs 1..{virtual_rows} weights >= 0 with a positive sum, got {weights}")
    cdf, first, width = _histogram_buckets(weights, virtual_rows)
    bucket = np.searchsorted(cdf, rng.random(n), side="right")
    np.minimum(bucket, len(weights) - 1, out=bucket)
    ranks = first[bucket] + rng.integers(0, width[bucket], dtype=np.int64)
    return zipf_rank_to_id(ranks + 1, virtual_rows)


def histogram_bucket_of(virtual_ids: np.ndarray, virtual_rows: int, buckets: int) -> np.ndarray:
    """The bucket of each virtual id (inverse of the scatter in `draw_histogram_ids`; for tests and
    checks)."""
    m = zipf_multiplier(int(virtual_rows))
    inverse = pow(m, -1, int(virtual_rows))
    ranks = np.array([(int(v) * inverse) % virtual_rows for v in np.asarray(virtual_ids).tolist()], dtype=np.int64)
    return np.searchsorted(_bucket_bounds(virtual_rows, buckets), ranks, side="right") - 1
