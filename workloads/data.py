"""Seeded synthetic input stream for a `WorkloadSpec` (no torchrec dependency).

A batch is a pure function of ``(spec.config.seed, rank, step)``: every call with the same triple gives
bit-identical tensors, whatever the process, the order of calls or ``world_size``.

Pipeline per table:

1. pooling factor per sample (``draw_pooling``): fixed | uniform | poisson | pareto;
2. ids over the table's virtual id space, mapped to its physical rows (workloads.ids).

The sparse layout matches torchrec's ``KeyedJaggedTensor``: ``lengths`` is table-major (all samples of
table 0, then table 1, ...), ``values`` the ids concatenated in the same order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from workloads.config import PoolingConfig
from workloads.ids import COMPILED_MIN_IDS, draw_virtual_ids, draw_zipf_grouped, to_physical, zipf_key
from workloads.zipf_law import zipf_multiplier
from workloads.spec import WorkloadSpec
from workloads.rules import HISTOGRAM, POOLING_DISTRIBUTIONS
from workloads.id_histogram import draw_histogram_ids, has_id_histograms


@dataclass
class Batch:
    dense_features: torch.Tensor  # float32 [batch_size, num_dense_features]
    keys: List[str]  # feature names in table order (TableSpec.feature_name)
    lengths: torch.Tensor  # int32 [num_tables * batch_size], table-major (KeyedJaggedTensor layout)
    values: torch.Tensor  # int64, concatenated physical row ids
    labels: torch.Tensor  # float32 [batch_size], 0/1

    @property
    def batch_size(self) -> int:
        return int(self.dense_features.shape[0])


# --------------------------------------------------------------------------------------------------
# Pooling factors
# --------------------------------------------------------------------------------------------------


def draw_pooling(rng: np.random.Generator, cfg: PoolingConfig, mean: float, n: int) -> np.ndarray:
    """``n`` pooling factors (ids per sample) as int64.

    - ``fixed``: ``round(mean)`` for every sample (half rounds up; not clipped to [min, max], so an
      explicit per-table mean such as MLPerf's 100-hot table is honoured exactly);
    - ``uniform``: integers in ``[cfg.min, cfg.max]`` inclusive (``mean`` is unused: the mean is
      ``(min + max) / 2``);
    - ``poisson``: Poisson(``mean``) clipped to ``[cfg.min, cfg.max]``;
    - ``pareto``: classical Pareto with shape ``a = cfg.pareto_alpha`` (> 1) and scale
      ``xm = mean * (a - 1) / a`` so that its mean is ``mean``; rounded, then clipped to
      ``[cfg.min, cfg.max]`` (clipping the tail lowers the realised mean slightly for heavy tails).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    check_pooling_law(cfg, mean)
    dist = cfg.distribution
    if dist == "fixed":
        return np.full(n, int(math.floor(mean + 0.5)), dtype=np.int64)
    lo, hi = int(cfg.min), int(cfg.max)
    if dist == "uniform":
        return rng.integers(lo, hi, size=n, endpoint=True, dtype=np.int64)
    if dist == "poisson":
        return np.clip(rng.poisson(mean, size=n), lo, hi).astype(np.int64, copy=False)
    a = float(cfg.pareto_alpha)  # pareto
    xm = mean * (a - 1.0) / a
    # numpy's `pareto` is Lomax (Pareto II); + 1 and * xm give the classical Pareto on [xm, inf)
    x = (rng.pareto(a, size=n) + 1.0) * xm
    return np.clip(np.rint(x), lo, hi).astype(np.int64)


def check_pooling_law(cfg: PoolingConfig, mean: float) -> None:
    """ValueError for a pooling law neither generator can draw (workloads.data, workloads.device_data)."""
    if mean < 0:
        raise ValueError(f"pooling mean must be >= 0, got {mean}")
    dist = cfg.distribution
    if dist not in POOLING_DISTRIBUTIONS:
        raise ValueError(f"unknown pooling distribution {dist!r} (workload.pooling.distribution: "
                         f"{' | '.join(POOLING_DISTRIBUTIONS)})")
    if dist == "fixed":
        return
    lo, hi = int(cfg.min), int(cfg.max)
    if lo < 0 or hi < lo:
        raise ValueError(f"pooling needs 0 <= min <= max, got min={lo}, max={hi}")
    if dist == "pareto" and not float(cfg.pareto_alpha) > 1.0:
        raise ValueError(f"pareto pooling needs pareto_alpha > 1 for a finite mean, got {cfg.pareto_alpha}")


# --------------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------------


# Streams of one batch are disjoint 2^96-draw windows of one PCG64 sequence (period 2^128).
STREAM_STRIDE = 2**96


def _batch_bitgen(seed: int, rank: int, step: int) -> np.random.PCG64:
    for name, v in (("seed", seed), ("rank", rank), ("step", step)):
        if int(v) < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    return np.random.PCG64(np.random.SeedSequence([int(seed), int(rank), int(step)]))


def batch_rng(seed: int, rank: int, step: int, stream: int) -> np.random.Generator:
    """The generator ``SyntheticBatches`` uses for one (seed, rank, step) and stream.

    Stream 0 draws the dense features and labels, stream ``1 + i`` table ``i``'s pooling factors then
    ids. All streams of a batch come from ``PCG64(SeedSequence([seed, rank, step]))``, stream ``s``
    starting ``s * 2^96`` draws in (an O(log) ``advance``, much cheaper than seeding a generator per
    stream), so a table's draws do not depend on what the other tables drew.
    """
    if int(stream) < 0:
        raise ValueError(f"stream must be >= 0, got {stream}")
    bitgen = _batch_bitgen(seed, rank, step)
    if stream:
        bitgen.advance(int(stream) * STREAM_STRIDE)
    return np.random.Generator(bitgen)


def _zipf_law(table) -> Tuple[float, int]:
    """What tables drawn in one Zipf pass share: the exponent and the id space."""
    return float(table.ids.zipf_alpha), int(table.virtual_rows)


def _draw_other_ids(rng: np.random.Generator, ids_cfg, virtual_rows: int, n: int) -> np.ndarray:
    """Ids of a table whose law is not Zipf: uniform (`draw_virtual_ids`) or a histogram
    (workloads.tables_file)."""
    if ids_cfg.distribution == HISTOGRAM:
        return draw_histogram_ids(rng, ids_cfg, virtual_rows, n)
    return draw_virtual_ids(rng, ids_cfg, virtual_rows, n)


def draws_on_device(generator: str, device_type: str, spec: WorkloadSpec) -> bool:
    """workload.generator: auto draws on the rank's GPU (no host-to-device copy per batch) unless a table has an
    id histogram, which only the host generator draws."""
    if generator == "auto":
        return device_type == "cuda" and not has_id_histograms(spec.tables)
    return generator == "device"


def check_stream_args(spec: WorkloadSpec, rank: int, world_size: int) -> None:
    """ValueError unless `rank` is one of `world_size` and every table is materialized (what either generator
    needs)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    unmaterialized = [t.name for t in spec.tables if t.physical_rows <= 0]
    if unmaterialized:
        raise ValueError(
            f"tables {unmaterialized} have physical_rows=0 (materialize={spec.config.materialize!r}); "
            "synthetic batches need materialized tables (materialize=full or scaled)"
        )


class SyntheticBatches:
    """Deterministic batches for one rank: ``batch(step)`` depends only on (config.seed, rank, step).

    Each table draws from its own stream (``batch_rng``), so changing one table's shape leaves the
    others' ids as they were. ``world_size`` is checked against ``rank`` but does not enter the values.
    """

    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int):
        check_stream_args(spec, rank, world_size)
        self.spec = spec
        self.rank = int(rank)
        self.world_size = int(world_size)
        cfg = spec.config
        self.seed = int(cfg.seed)
        self.batch_size = int(cfg.batch_size)
        self.num_dense_features = int(cfg.num_dense_features)
        self.keys: List[str] = [t.feature_name for t in spec.tables]
        for t in spec.tables:  # fail on a bad config now rather than at the first batch
            if t.ids.distribution in ("zipf", HISTOGRAM):
                zipf_multiplier(int(t.virtual_rows))

    def batch(self, step: int) -> Batch:
        n = self.batch_size
        bitgen = _batch_bitgen(self.seed, self.rank, step)
        rng = np.random.Generator(bitgen)  # stream 0 (see `batch_rng`); the tables' streams rewind to its start
        start = bitgen.state
        dense = rng.standard_normal((n, self.num_dense_features), dtype=np.float32)
        labels = (rng.random(n) < 0.5).astype(np.float32)
        lengths, values_np = self._draw_tables(bitgen, start, range(len(self.spec.tables)))
        lengths_np = np.concatenate(lengths).astype(np.int32) if lengths else np.zeros(0, np.int32)
        return Batch(
            dense_features=torch.from_numpy(dense),
            keys=list(self.keys),
            lengths=torch.from_numpy(lengths_np),
            values=torch.from_numpy(values_np),
            labels=torch.from_numpy(labels),
        )

    def tables_of(self, rank: int, step: int, tables: Sequence[int]) -> Tuple[List[np.ndarray], np.ndarray]:
        """(pooling factors of each of `tables`, their ids one table after the other) in batch `step` of `rank`
        (any rank of the job): exactly what that rank's `batch(step)` holds for them, drawn without the other
        tables (what an emulated rank's peers send it: bench.run.peer_batches)."""
        check_stream_args(self.spec, rank, self.world_size)
        bitgen = _batch_bitgen(self.seed, rank, step)
        return self._draw_tables(bitgen, bitgen.state, tables)

    def _draw_tables(self, bitgen: np.random.PCG64, start, tables: Sequence[int]):
        """Pooling factors (one array a table) and ids (concatenated) of `tables`, in their order, each from its
        own stream (1 + table index) of the batch whose generator is `bitgen`, `start` its initial state."""
        n, specs = self.batch_size, [self.spec.tables[i] for i in tables]
        rng = np.random.Generator(bitgen)
        # per table: its pooling factors, then its ids -- Zipf: the key of its draw (`zipf_key`); the Zipf tables
        # of one law and id space are then drawn in one pass (a table draws the same ids alone or grouped)
        lengths: List[np.ndarray] = []
        counts: List[int] = []
        keys: List[Optional[int]] = []
        others: List[Optional[np.ndarray]] = []
        for i, t in zip(tables, specs):
            bitgen.state = start  # stream 1 + i: rewind, then jump to its window
            bitgen.advance((1 + i) * STREAM_STRIDE)
            lens = draw_pooling(rng, t.pooling, t.pooling_mean, n)
            lengths.append(lens)
            counts.append(int(lens.sum()))
            ids_cfg = t.ids
            if ids_cfg.distribution == "zipf":
                keys.append(zipf_key(rng))
                others.append(None)
            else:
                keys.append(None)
                others.append(_draw_other_ids(rng, ids_cfg, t.virtual_rows, counts[-1]))

        offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
        values_np = np.empty(offsets[-1], dtype=np.int64)
        laws: Dict[Tuple[float, int], List[int]] = {}  # Zipf tables by (alpha, id space), each law drawn in one call
        for j, t in enumerate(specs):
            if keys[j] is None:
                values_np[offsets[j] : offsets[j + 1]] = others[j]
            else:
                laws.setdefault(_zipf_law(t), []).append(j)
        compiled = sum(counts[j] for group in laws.values() for j in group) >= COMPILED_MIN_IDS
        for (alpha, n_ranks), group in laws.items():
            draw_zipf_grouped(alpha, n_ranks, [keys[j] for j in group], [counts[j] for j in group], values_np,
                              starts=[offsets[j] for j in group], compiled=compiled)
        for j, t in enumerate(specs):  # virtual -> physical rows (the identity when materialized in full)
            if t.physical_rows != t.virtual_rows:
                part = values_np[offsets[j] : offsets[j + 1]]
                part[...] = to_physical(part, t.virtual_rows, t.physical_rows)
        return lengths, values_np

    def __iter__(self) -> Iterator[Batch]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1
