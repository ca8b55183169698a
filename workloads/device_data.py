"""Synthetic batches drawn with torch ops on the training device: no numpy, no host -> device copy.

``DeviceSyntheticBatches(spec, rank, world_size, device)`` is the device-side twin of
``workloads.data.SyntheticBatches``: the same laws (pooling fixed | uniform | poisson | pareto; ids uniform
or the bounded Zipf law of ``workloads.zipf_law`` -- exact head of ``ZIPF_EXACT_HEAD`` ranks, rounded continuous
tail -- with ranks scattered by the same modular multiplier; virtual -> physical rows by the same
splitmix64 hash as ``workloads.ids.to_physical``), returning a ``workloads.data.Batch`` whose tensors live
on ``device``. The values differ from ``SyntheticBatches``'s (another generator); the laws are the same.

A batch is a pure function of ``(spec.config.seed, rank, step)`` on a given device type: one
``torch.Generator`` on ``device``, seeded from the triple, draws the dense features and labels, then every
table's pooling factors, then the ids of all tables at once (so, unlike ``SyntheticBatches``, changing one
table changes the other tables' ids). Runs of consecutive tables with the same id law and sizes are drawn in
one pass of a few elementwise kernels. Pooling other than ``fixed`` costs one device -> host sync per batch
(the number of ids sizes the values tensor).

Integer arithmetic: torch has no uint64 mulmod, so ``(a * m) mod n`` is exact int64 arithmetic in chunks
small enough never to overflow (`_mulmod`), and splitmix64 runs on int64 with wrapping multiplication
(what CPU and CUDA int64 kernels do) and masked (logical) right shifts.
"""
from __future__ import annotations

import math
from typing import Iterator, List, Sequence

import torch

from workloads.data import Batch, check_pooling_law, check_stream_args
from workloads.hashing import SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2
from workloads.zipf_law import ZipfTable, zipf_multiplier, zipf_table
from workloads.rules import ID_DISTRIBUTIONS
from workloads.spec import WorkloadSpec

_MASK64 = (1 << 64) - 1
_INT64_MAX = 2**63 - 1


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 with the same bits."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _splitmix_int(x: int) -> int:
    """splitmix64 on a Python int (seed mixing on the host)."""
    z = (x + SPLITMIX_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * SPLITMIX_M1) & _MASK64
    z = ((z ^ (z >> 27)) * SPLITMIX_M2) & _MASK64
    return z ^ (z >> 31)


def batch_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the device generator of one (seed, rank, step): a splitmix64 chain, < 2^63."""
    for name, v in (("seed", seed), ("rank", rank), ("step", step)):
        if int(v) < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")
    h = 0
    for v in (int(seed), int(rank), int(step)):
        h = _splitmix_int(h ^ (v & _MASK64) ^ ((v >> 64) * SPLITMIX_GAMMA))
    return h >> 1


# --------------------------------------------------------------------------------------------------
# Exact int64 arithmetic on tensors
# --------------------------------------------------------------------------------------------------


def _mulmod(a: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """``(a * m) mod n`` elementwise, exact, for int64 ``0 <= a < n`` and ``0 <= m``, ``n < 2^61``.

    One product when ``(n - 1) * m < 2^63``; else Horner over ``m``'s bits in chunks of
    ``c = 62 - bit_length(n)`` bits: ``r = (r * 2^c + a * chunk) mod n``, where no product exceeds 2^62.
    """
    m %= n
    if (n - 1) * m <= _INT64_MAX:
        return torch.remainder(a * m, n)
    if n >= 2**61:  # (chunks of c >= 1 bits; zipf_multiplier keeps (n - 1) * m < 2^63 past 2^50 anyway)
        raise ValueError(f"_mulmod supports n < 2^61 when (n - 1) * m >= 2^63, got {n}")
    c = 62 - n.bit_length()
    chunks = []
    while m:
        chunks.append(m & ((1 << c) - 1))
        m >>= c
    r = torch.zeros_like(a)
    for chunk in reversed(chunks):
        r = torch.remainder(r * (1 << c), n)  # r < n: r * 2^c < 2^62
        if chunk:
            r = torch.remainder(r + torch.remainder(a * chunk, n), n)
    return r


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's ``>>`` on int64 is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64_t(x: torch.Tensor) -> torch.Tensor:
    """``workloads.hashing.splitmix64`` on int64 tensors (the uint64 result's bits, as int64)."""
    z = x + _signed(SPLITMIX_GAMMA)
    z = z ^ _shr(z, 30)
    z = z * _signed(SPLITMIX_M1)
    z = z ^ _shr(z, 27)
    z = z * _signed(SPLITMIX_M2)
    return z ^ _shr(z, 31)


def to_physical_t(virtual_ids: torch.Tensor, virtual_rows: int, physical_rows: int) -> torch.Tensor:
    """``workloads.ids.to_physical`` on tensors: identity, or ``splitmix64(id) mod physical_rows``."""
    physical_rows, virtual_rows = int(physical_rows), int(virtual_rows)
    if physical_rows <= 0:
        raise ValueError(f"table has physical_rows={physical_rows}: it is not materialized (materialize=plan_only?)")
    if physical_rows == virtual_rows:
        return virtual_ids
    h = splitmix64_t(virtual_ids)
    hi, lo = _shr(h, 32), h & 0xFFFFFFFF  # the unsigned value is hi * 2^32 + lo
    r = _mulmod(torch.remainder(hi, physical_rows), 2**32, physical_rows)
    return torch.remainder(r + torch.remainder(lo, physical_rows), physical_rows)


# --------------------------------------------------------------------------------------------------
# Laws
# --------------------------------------------------------------------------------------------------


def zipf_ranks_t(u: torch.Tensor, tab: ZipfTable, head_cdf: torch.Tensor) -> torch.Tensor:
    """The inverse CDF of ``workloads.zipf_law``'s law at float64 ``u`` in [0, 1): int64 ranks.

    ``head_cdf``: ``tab.cdf[1 : k + 1]`` on u's device (P(rank <= r), r = 1..k; +inf past the head when
    there is no tail). Head: the count of head boundaries <= u, plus one. Tail: the continuous power law's
    inverse CDF, rounded (``workloads.zipf_law.zipf_table``'s expm1/log1p form).
    """
    head = torch.searchsorted(head_cdf, u, right=True) + 1
    if tab.head_mass > 1.0:  # no tail
        return head.clamp_(max=tab.k)
    x = u * tab.tail_scale + tab.tail_shift
    x = x.clamp(min=0.0) if tab.tail_scale >= 0 else x.clamp(max=0.0)
    if tab.inv_b != 0.0:
        x = torch.log1p(x) * tab.inv_b
    x = torch.exp(x + tab.log_lo).round_().clamp_(float(tab.k + 1), float(tab.n_ranks))
    return torch.where(u < tab.head_mass, head, x.to(torch.int64))


def rank_to_id_t(ranks: torch.Tensor, n: int) -> torch.Tensor:
    """``workloads.zipf_law.zipf_rank_to_id`` on tensors: ``(k - 1) * zipf_multiplier(n) mod n``."""
    m = zipf_multiplier(int(n))
    ids = ranks - 1
    return ids if m == 1 else _mulmod(ids, m, int(n))


class DeviceSyntheticBatches:
    """Batches drawn on ``device`` (torch ops only): ``batch(step)`` depends only on (config.seed, rank, step).

    ``DeviceSyntheticBatches(spec, rank, world_size, device="cpu")``; ``batch(step) -> Batch`` with every
    tensor on ``device``; iterating yields steps 0, 1, ... Pooling: fixed | uniform | poisson | pareto;
    ids: uniform | zipf (anything else: ValueError naming the config key).
    """

    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int, device="cpu"):
        check_stream_args(spec, rank, world_size)
        self.spec = spec
        self.rank, self.world_size = int(rank), int(world_size)
        self.device = torch.device(device)
        cfg = spec.config
        self.seed = int(cfg.seed)
        self.batch_size = int(cfg.batch_size)
        self.num_dense_features = int(cfg.num_dense_features)
        self.keys: List[str] = [t.feature_name for t in spec.tables]
        self._generator = torch.Generator(device=self.device)
        self._head_cdf = {}
        for t in spec.tables:
            check_pooling_law(t.pooling, t.pooling_mean)
            ids = t.ids
            if ids.distribution not in ID_DISTRIBUTIONS:
                raise ValueError(f"workload.ids.distribution={ids.distribution!r} is not supported by the device "
                                 f"generator (supported: {' | '.join(ID_DISTRIBUTIONS)})")
            if ids.distribution == "zipf":
                key = (float(ids.zipf_alpha), int(t.virtual_rows))
                if not key[0] > 0:
                    raise ValueError(f"zipf alpha must be > 0, got {key[0]}")
                if key not in self._head_cdf:
                    tab = zipf_table(*key)
                    zipf_multiplier(key[1])
                    self._head_cdf[key] = torch.tensor(tab.cdf[1 : tab.k + 1], dtype=torch.float64,
                                                       device=self.device)
        # runs of consecutive tables drawn in one pass: same id law, id space and physical rows
        self._runs: List[Sequence[int]] = []
        for i, t in enumerate(spec.tables):
            if self._runs and self._run_key(spec.tables[self._runs[-1][0]]) == self._run_key(t):
                self._runs[-1].append(i)
            else:
                self._runs.append([i])

    def _run_key(self, t):
        ids = t.ids
        alpha = float(ids.zipf_alpha) if ids.distribution == "zipf" else None
        return ids.distribution, alpha, int(t.virtual_rows), int(t.physical_rows)

    def _lengths(self, g: torch.Generator) -> torch.Tensor:
        """int64 [num_tables, batch_size] pooling factors."""
        n, dev = self.batch_size, self.device
        rows = []
        for t in self.spec.tables:
            pool = t.pooling
            mean = float(t.pooling_mean)
            dist, lo, hi = pool.distribution, int(pool.min), int(pool.max)
            if dist == "fixed":
                rows.append(torch.full((n,), int(math.floor(mean + 0.5)), dtype=torch.int64, device=dev))
            elif dist == "uniform":
                rows.append(torch.randint(lo, hi + 1, (n,), generator=g, device=dev, dtype=torch.int64))
            elif dist == "poisson":
                rate = torch.full((n,), mean, dtype=torch.float32, device=dev)
                rows.append(torch.poisson(rate, generator=g).clamp_(lo, hi).to(torch.int64))
            else:  # pareto: classical Pareto with mean `mean`, by inversion
                a = float(pool.pareto_alpha)
                xm = mean * (a - 1.0) / a
                u = torch.rand((n,), generator=g, device=dev, dtype=torch.float64)
                x = torch.pow(1.0 - u, -1.0 / a) * xm
                rows.append(x.round_().clamp_(lo, hi).to(torch.int64))
        if not rows:
            return torch.zeros((0, n), dtype=torch.int64, device=dev)
        return torch.stack(rows)

    def _ids(self, g: torch.Generator, run: Sequence[int], count: int) -> torch.Tensor:
        t = self.spec.tables[run[0]]
        ids_law = t.ids
        n_rows = int(t.virtual_rows)
        if ids_law.distribution == "uniform":
            vids = torch.randint(0, n_rows, (count,), generator=g, device=self.device, dtype=torch.int64)
        else:
            key = (float(ids_law.zipf_alpha), n_rows)
            u = torch.rand((count,), generator=g, device=self.device, dtype=torch.float64)
            ranks = zipf_ranks_t(u, zipf_table(*key), self._head_cdf[key])
            vids = rank_to_id_t(ranks, n_rows)
        return to_physical_t(vids, n_rows, t.physical_rows)

    def batch(self, step: int) -> Batch:
        n, dev, g = self.batch_size, self.device, self._generator
        g.manual_seed(batch_seed(self.seed, self.rank, step))
        dense = torch.randn((n, self.num_dense_features), generator=g, device=dev, dtype=torch.float32)
        labels = (torch.rand((n,), generator=g, device=dev) < 0.5).to(torch.float32)
        lengths = self._lengths(g)
        if all(t.pooling.distribution == "fixed" for t in self.spec.tables):
            per_table = [n * int(math.floor(float(t.pooling_mean) + 0.5)) for t in self.spec.tables]
        else:
            per_table = lengths.sum(dim=1).tolist()  # the one device -> host sync
        parts = [self._ids(g, run, sum(per_table[i] for i in run)) for run in self._runs]
        values = torch.cat(parts) if len(parts) > 1 else (
            parts[0] if parts else torch.zeros(0, dtype=torch.int64, device=dev))
        return Batch(
            dense_features=dense,
            keys=list(self.keys),
            lengths=lengths.reshape(-1).to(torch.int32),
            values=values,
            labels=labels,
        )

    def __iter__(self) -> Iterator[Batch]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1
