"""Ids of a synthetic batch: which rows of a table its samples look up.

1. ids over the table's VIRTUAL id space ``[0, virtual_rows)`` (``draw_virtual_ids``): uniform, or a
   bounded Zipf law drawn by inverse CDF, its popularity ranks scattered over the id space by a
   modular multiplication (``zipf_rank_to_id``) -- nothing of size ``virtual_rows`` is allocated, so
   virtual spaces of 1e10+ rows are fine;
2. virtual -> PHYSICAL row (``to_physical``): identity when the table is materialized in full, else a
   splitmix64 hash modulo ``physical_rows``.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from workloads.config import IdsConfig
from workloads.id_kernels import COMPILED_MIN_IDS, SPLITMIX_GAMMA, SPLITMIX_M1, SPLITMIX_M2, compiled_bucket_lookup

# Golden-ratio conjugate: a multiplier near phi^-1 * N spreads consecutive ranks evenly (Weyl sequence).
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_INT64_MAX = 2**63 - 1


# --------------------------------------------------------------------------------------------------
# Ids over the virtual id space
# --------------------------------------------------------------------------------------------------


ZIPF_EXACT_HEAD = 32
_ZIPF_GUIDE_MIN, _ZIPF_GUIDE_MAX = 1024, 2**16


@dataclass(frozen=True)
class _ZipfTable:
    n_ranks: int
    k: int  # ranks 1..k drawn exactly (k = min(n_ranks, ZIPF_EXACT_HEAD))
    head_mass: float  # P(rank <= k); > 1 when there is no tail (n_ranks <= k)
    cdf: np.ndarray  # cdf[r] = P(rank <= r) for r = 0..k, then +inf (len k + 2)
    guide: np.ndarray  # guide[j] = rank of the point j * head_mass / G (len G + 1)
    guide_scale: float  # G / head_mass
    corrections: int  # most cdf boundaries inside one guide bucket
    tail_scale: float  # v * expm1(b D) = u * tail_scale + tail_shift, v = (u - H) / (1 - H)
    tail_shift: float
    inv_b: float  # 1 / b, or 0 for the log form (alpha == 1)
    log_lo: float


@lru_cache(maxsize=1024)
def _zipf_table(alpha: float, n_ranks: int) -> _ZipfTable:
    """Per-(alpha, n_ranks) constants of `draw_zipf_ranks` (O(ZIPF_EXACT_HEAD + guide) memory)."""
    k = min(n_ranks, ZIPF_EXACT_HEAD)
    head_w = np.arange(1, k + 1, dtype=np.float64) ** -alpha
    b = 1.0 - alpha
    lo, hi = k + 0.5, n_ranks + 0.5
    d = math.log(hi / lo)
    log_form = abs(b) < 1e-9
    if n_ranks <= k:
        tail_w = 0.0
    elif log_form:
        tail_w = d  # integral of x^-1 over [lo, hi]
    else:  # integral of x^-alpha over [lo, hi] = lo^b * expm1(b d) / b
        tail_w = lo**b * math.expm1(b * d) / b
    total = float(head_w.sum()) + tail_w
    cdf = np.concatenate([[0.0], np.cumsum(head_w) / total, [np.inf]])
    # (a steep enough alpha leaves the tail no float64 mass at all: then it is never drawn)
    has_tail = n_ranks > k and cdf[k] < 1.0
    head_mass = float(cdf[k]) if has_tail else 2.0
    if not has_tail:
        cdf[k] = np.inf  # every u in [0, 1) lands at rank <= k, even after rounding in the cumsum
    span = head_mass if has_tail else 1.0
    # guide buckets: narrower than the smallest head probability where affordable, so one compare
    # per draw finds the rank; else (steep alpha) as many compares as boundaries share a bucket
    p_min = float(np.min(head_w[1:]) / total) if k > 1 else span
    g = int(min(_ZIPF_GUIDE_MAX, max(_ZIPF_GUIDE_MIN, 2 ** math.ceil(math.log2(2 * span / p_min)))))
    points = np.arange(g + 1, dtype=np.float64) * (span / g)
    guide = np.searchsorted(cdf[1 : k + 1], points, side="right").astype(np.int64) + 1
    np.minimum(guide, k, out=guide)
    corrections = max(1, int(np.max(guide[1:] - guide[:-1])))
    one_minus_h = 1.0 - head_mass if has_tail else 1.0
    c = d if log_form else math.expm1(b * d)
    return _ZipfTable(
        n_ranks=int(n_ranks),
        k=k,
        head_mass=head_mass,
        cdf=cdf,
        guide=guide,
        guide_scale=g / span,
        corrections=corrections,
        tail_scale=c / one_minus_h,
        tail_shift=-head_mass * c / one_minus_h if has_tail else 0.0,
        inv_b=0.0 if log_form else 1.0 / b,
        log_lo=math.log(lo),
    )


def _zipf_head_ranks(tab: _ZipfTable, u: np.ndarray) -> np.ndarray:
    """Exact discrete inverse CDF over ranks 1..k for every u.

    Guide-table inversion: the bucket of ``u`` gives the rank at the bucket's start, then a fixed
    number of vectorized steps ``r += u >= cdf[r]`` (as many as the most boundaries in one bucket,
    usually one). For ``u >= head_mass`` the result is ``k + 1`` (the caller uses the tail there).
    """
    j = np.multiply(u, tab.guide_scale)
    np.minimum(j, float(len(tab.guide) - 1), out=j)
    r = tab.guide.take(j.astype(np.int64))
    for _ in range(tab.corrections):
        r += u >= tab.cdf.take(r)
    return r


def _zipf_ranks_from_u(tab: _ZipfTable, u: np.ndarray) -> np.ndarray:
    """The inverse CDF of `draw_zipf_ranks`'s law at every ``u`` in [0, 1) (float64): ranks (int64).

    Exact discrete inverse over the head (ranks <= k), the continuous power law's inverse CDF, rounded,
    over the tail (see `draw_zipf_ranks`). Monotone non-decreasing in ``u``.
    """
    head = _zipf_head_ranks(tab, u)
    if tab.head_mass > 1.0:  # n_ranks <= K: no tail
        return head
    # tail, for every u (the head's u are overwritten below): w = v * expm1(b D) with v clipped at 0
    x = np.multiply(u, tab.tail_scale)
    x += tab.tail_shift
    if tab.tail_scale >= 0:
        np.maximum(x, 0.0, out=x)
    else:
        np.minimum(x, 0.0, out=x)
    if tab.inv_b != 0.0:  # (the log form needs nothing more: x is already v * D)
        np.log1p(x, out=x)
        x *= tab.inv_b
    x += tab.log_lo
    np.exp(x, out=x)
    np.rint(x, out=x)
    # float64 rounding near the ends (n_ranks ~ 1e10+) can land one outside the range
    np.clip(x, float(tab.k + 1), float(tab.n_ranks), out=x)
    r = x.astype(np.int64)
    np.copyto(r, head, where=u < tab.head_mass)
    return r


# --------------------------------------------------------------------------------------------------
# Fast path: a table over the top bits of u (buckets that hold a single rank), exact inversion elsewhere
# --------------------------------------------------------------------------------------------------

_U_BITS = 53  # u = U / 2^53 with U a 53-bit integer: float64 represents it exactly
_TOP_BITS = 32  # bits of U drawn for every id; the other 21 only for ids in a mixed bucket
_LOW_BITS = _U_BITS - _TOP_BITS
_INT32_MAX = 2**31 - 1
_INT16_MAX = 2**15 - 1


def zipf_bucket_bits(n_ranks: int) -> int:
    """Bits of the bucket table `draw_zipf_ranks` uses for a space of ``n_ranks`` ranks (fixed by n_ranks).

    A space of ``n`` ranks has at most ``n - 1`` rank boundaries, so at most ``n - 1`` of the ``2^B``
    buckets hold more than one rank: ``B = bit_length(n) + 4`` keeps that share <= 1/16, capped at 18
    bits (a 1 MiB int32 table) for up to 2^16 ranks. Larger spaces get 16 bits: there the tail ranks
    are finer than any affordable bucket anyway, and more bits buy little.
    """
    n_ranks = int(n_ranks)
    if n_ranks <= 2**16:
        return max(8, min(18, n_ranks.bit_length() + 4))
    return 16


@dataclass(frozen=True)
class _ZipfBuckets:
    bits: int
    # [2^bits]: the rank (or id) every u of the bucket maps to; -1: a bucket of several ranks (the inverse-CDF
    # formula decides); -2 - i: a bucket of exactly two ranks, split at split_offsets[i] (below it the first)
    table: np.ndarray
    # per two-rank bucket: the offset of its split in units of 2^-53 from the bucket's start, its two values
    split_offsets: np.ndarray
    split_first: np.ndarray
    split_second: np.ndarray


def _two_rank_splits(tab: _ZipfTable, starts: np.ndarray, width_bits: int, second: np.ndarray) -> np.ndarray:
    """For buckets starting at the 53-bit ``starts`` (2^width_bits wide) that hold two ranks, the smallest offset
    whose u the inverse CDF maps to the ``second`` rank: a bisection on the same function the draws use, so a
    draw compared against it gets exactly the formula's rank."""
    low = np.zeros(len(starts), dtype=np.int64)  # maps to the first rank
    high = np.full(len(starts), (1 << width_bits) - 1, dtype=np.int64)  # maps to the second
    for _ in range(width_bits):
        middle = (low + high) // 2
        to_second = _zipf_ranks_from_u(tab, np.ldexp((starts + middle).astype(np.float64), -_U_BITS)) == second
        high = np.where(to_second, middle, high)
        low = np.where(to_second, low, middle)
    return high


@lru_cache(maxsize=256)
def _zipf_buckets(alpha: float, n_ranks: int, as_ids: bool) -> _ZipfBuckets:
    """Per-(alpha, n_ranks) bucket table of the fast path: int16 / int32 when ids fit (<= 1 MiB), else int64.

    Bucket ``j`` holds the u in ``[j, j + 1) / 2^B``; it is *pure* when the inverse CDF maps its first
    and its last 53-bit u to the same rank (the inverse CDF is monotone, so every u between does too),
    and the table then holds that rank (``as_ids``: its id, `zipf_rank_to_id`). A bucket whose last rank is
    the first's next holds two, and the compiled loop (workloads.id_kernels) splits it at the exact offset
    where the formula switches; others are -1. Built in 2^(B+1) vectorized evaluations and a bisection
    (~20 ms); at most 256 tables are kept.
    """
    tab = _zipf_table(alpha, n_ranks)
    bits = zipf_bucket_bits(n_ranks)
    j = np.arange(1 << bits, dtype=np.int64)
    shift = _U_BITS - bits
    first = _zipf_ranks_from_u(tab, np.ldexp((j << shift).astype(np.float64), -_U_BITS))
    last = _zipf_ranks_from_u(tab, np.ldexp((((j + 1) << shift) - 1).astype(np.float64), -_U_BITS))
    to_value = (lambda r: zipf_rank_to_id(r, n_ranks)) if as_ids else (lambda r: r)
    table = np.where(first == last, to_value(first), -1)
    two = np.flatnonzero(last == first + 1)
    table[two] = -2 - np.arange(len(two))
    splits = _two_rank_splits(tab, two << shift, shift, last[two])
    if n_ranks <= _INT16_MAX:  # the smallest type that holds every id: a smaller table stays in cache
        table = table.astype(np.int16)
    elif n_ranks <= _INT32_MAX:
        table = table.astype(np.int32)
    for array in (table, splits):
        array.setflags(write=False)
    return _ZipfBuckets(bits=bits, table=table, split_offsets=splits,
                        split_first=np.ascontiguousarray(to_value(first[two]), dtype=np.int64),
                        split_second=np.ascontiguousarray(to_value(last[two]), dtype=np.int64))


_SCRATCH_MAX = 1 << 22  # ids per call up to which the per-thread scratch buffers are reused
_scratch_local = threading.local()


def _scratch(dtype: type, n: int) -> np.ndarray:
    """A length-``n`` work array of ``dtype``, reused across calls in this thread (fresh above
    ``_SCRATCH_MAX``): a fresh multi-MB array costs page faults that cost as much as the work on it."""
    if n > _SCRATCH_MAX:
        return np.empty(n, dtype=dtype)
    key = np.dtype(dtype).char
    buffers = _scratch_local.__dict__.setdefault("buffers", {})
    buf = buffers.get(key)
    if buf is None or len(buf) < n:
        buf = buffers[key] = np.empty(max(n, 1 << 16), dtype=dtype)
    return buf[:n]


def zipf_key(rng: np.random.Generator) -> int:
    """A table's Zipf draw is keyed by one 64-bit word of its generator: its uniforms come from the SplitMix64
    sequence of that key (`zipf_stream_words`), which the compiled loop can produce in place."""
    return int(rng.bit_generator.random_raw())


def zipf_stream_words(key: int, start: int, count: int) -> np.ndarray:
    """Words ``start .. start + count - 1`` of the SplitMix64 sequence seeded with ``key`` (uint64):
    ``W_j = splitmix64(key + j * gamma)``, as workloads.id_kernels computes them one by one."""
    index = np.arange(start, start + count, dtype=np.uint64)
    index *= _SM_GAMMA
    index += np.uint64(key)
    return splitmix64(index)


def _top_words(key: int, n: int) -> np.ndarray:
    """The top 32 of the 53 bits of each of ``n`` draws: the halves of words ``0 .. ceil(n/2) - 1``, low half
    first (draw ``i`` takes word ``i // 2``)."""
    return zipf_stream_words(key, 0, (n + 1) // 2).view(np.uint32)[:n]


def draw_zipf_grouped(alpha: float, n_ranks: int, keys: Sequence[int], counts: Sequence[int], out: np.ndarray,
                      as_ids: bool = True, compiled: bool = True) -> None:
    """Zipf ranks (or ids) for several tables of the same (alpha, n_ranks) in one pass, into ``out``.

    Table ``i`` draws ``counts[i]`` values keyed by ``keys[i]`` (`zipf_key`); ``out`` is their concatenation
    (int64). Table ``i`` gets exactly what ``_draw_zipf`` draws for it alone: grouping changes the speed only.

    Draw ``d`` of a table has the 53-bit uniform ``u = (U_hi * 2^21 + U_lo) / 2^53``: ``U_hi`` is half of word
    ``d // 2`` of the table's SplitMix64 stream (low half for even ``d``), and a cached table over its top
    ``B`` bits (`zipf_bucket_bits`) gives the rank outright when that bucket holds a single rank. A draw in a
    mixed bucket takes ``U_lo`` from the top 21 bits of the next unused word (words ``ceil(n / 2)`` on, in
    draw order) and the inverse-CDF formula. Every draw is thus the exact inverse CDF (`_zipf_ranks_from_u`)
    of its 53-bit uniform. The bucket lookup runs compiled (workloads.id_kernels) for large draws, unless
    ``compiled`` is False; the values are the same.
    """
    tab = _zipf_table(alpha, n_ranks)
    buckets = _zipf_buckets(alpha, n_ranks, as_ids)
    n = len(out)
    if n == 0:
        return
    shift = _TOP_BITS - buckets.bits
    bucket_lookup = compiled_bucket_lookup() if n >= COMPILED_MIN_IDS and compiled else None
    positions, u = _scratch(np.int64, n), _scratch(np.uint64, n)
    starts = np.cumsum([0, *counts], dtype=np.int64)
    if bucket_lookup is not None:  # one compiled pass: words made, looked up, mixed draws completed in place
        count = bucket_lookup(np.array(keys, dtype=np.uint64), starts, np.uint64(shift), np.uint64(_LOW_BITS),
                              buckets.table, buckets.split_offsets, buckets.split_first, buckets.split_second,
                              out, positions, u)
    else:
        count = 0
        for t, key in enumerate(keys):
            start, end = int(starts[t]), int(starts[t + 1])
            hi = _top_words(key, end - start)
            part = out[start:end]
            part[...] = buckets.table.take(hi >> np.uint32(shift))
            mixed = np.flatnonzero(part < 0)
            low = zipf_stream_words(key, (end - start + 1) // 2, mixed.size) >> np.uint64(64 - _LOW_BITS)
            positions[count:count + mixed.size] = mixed + start
            u[count:count + mixed.size] = (hi[mixed].astype(np.uint64) << np.uint64(_LOW_BITS)) | low
            count += mixed.size
    if not count:
        return
    u = u[:count]
    r = _zipf_ranks_from_u(tab, np.ldexp(u.astype(np.float64), -_U_BITS))
    out[positions[:count]] = zipf_rank_to_id(r, n_ranks) if as_ids else r


def _draw_zipf(rng: np.random.Generator, alpha: float, n_ranks: int, n: int, as_ids: bool,
               out: Optional[np.ndarray]) -> np.ndarray:
    """``n`` Zipf ranks (or ids) from ``rng`` into ``out`` (a new array if None): `zipf_key`, then
    ``draw_zipf_grouped`` for this one table."""
    if out is None:
        out = np.empty(n, dtype=np.int64)
    elif out.shape != (n,) or out.dtype != np.int64:
        raise ValueError(f"out must be an int64 array of shape ({n},), got {out.dtype} {out.shape}")
    draw_zipf_grouped(alpha, n_ranks, [zipf_key(rng)], [n], out, as_ids)
    return out


def _check_zipf_args(alpha: float, n_ranks: int) -> None:
    if not alpha > 0:
        raise ValueError(f"zipf alpha must be > 0, got {alpha}")
    if n_ranks < 1:
        raise ValueError(f"zipf needs at least one rank, got {n_ranks}")


def draw_zipf_ranks(rng: np.random.Generator, alpha: float, n_ranks: int, n: int) -> np.ndarray:
    """``n`` popularity ranks in ``[1, n_ranks]`` with ``P(k) ~ k^-alpha`` (int64), any ``alpha > 0``.

    The top ``ZIPF_EXACT_HEAD`` (32) ranks get their exact discrete mass ``k^-alpha`` (guide-table
    inverse CDF). Beyond them, inverse CDF of the continuous power law ``x^-alpha`` truncated to
    ``[K + 0.5, n_ranks + 0.5]``, rounded to the nearest integer: rank ``k`` gets the mass of
    ``[k - 0.5, k + 0.5]``, within ``alpha (alpha + 1) / (24 k^2)`` (< 0.05 % for k > 32 and
    alpha <= 3) of ``k^-alpha``. With ``b = 1 - alpha``, ``D = log(hi / lo)`` and ``v`` uniform on
    [0, 1)::

        x = lo * exp(log1p(v * expm1(b * D)) / b)        (alpha != 1)
        x = lo * exp(v * D)                              (alpha == 1, the limit b -> 0)

    written with expm1/log1p so it stays accurate for alpha near 1 and for ``n_ranks`` up to 2^63.
    Nothing of size ``n_ranks`` is allocated.

    Speed: the inverse CDF is evaluated exactly only where it must be. ``u`` is a 53-bit uniform whose
    top 32 bits are drawn for every id; a cached table over its top ``B`` bits (`zipf_bucket_bits`)
    gives the rank outright for the buckets that hold a single rank (all but <= 1/16 of the draws
    for up to 2^16 ranks); the draws in the other buckets get their 21 low bits and the formula above.
    """
    _check_zipf_args(alpha, n_ranks)
    return _draw_zipf(rng, float(alpha), int(n_ranks), int(n), as_ids=False, out=None)


_MULMOD_FLOAT_MAX_N = 2**50


@lru_cache(maxsize=4096)
def zipf_multiplier(n: int) -> int:
    """Multiplier ``m`` coprime to ``n`` used by ``zipf_rank_to_id``.

    The largest value coprime to ``n`` at or below ``phi^-1 * n`` (consecutive ranks land ~0.618 n
    apart, a Weyl sequence), so ``k -> (k - 1) * m mod n`` is a bijection of ``[1, n]`` onto
    ``[0, n)``. For ``n > 2^50`` (beyond the exact float-assisted mulmod) it is capped at
    ``(2^63 - 1) // n`` so the plain int64 product is exact.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if n <= 2:
        return 1
    m = max(1, int(_GOLDEN * n))
    if n > _MULMOD_FLOAT_MAX_N:
        m = max(1, min(m, _INT64_MAX // n))
    while math.gcd(m, n) != 1:
        m -= 1  # m = 1 is always coprime, so this terminates
    return m


def _umod_inplace(x: np.ndarray, n: int) -> None:
    """``x %= n`` for uint64 ``x`` as ``x - (x // n) * n``: numpy divides by a scalar with a precomputed
    reciprocal (libdivide), several times faster than its ``remainder`` loop; the same values."""
    d = np.uint64(n)
    q = x // d
    q *= d
    x -= q


def mulmod(a: np.ndarray, m: int, n: int) -> np.ndarray:
    """Exact ``(a * m) mod n`` elementwise for int64 ``0 <= a < n``, ``0 <= m < n``.

    ``a * m < 2^63``: plain int64. Else (``n <= 2^50``): the quotient ``q = floor(a * (m / n))`` from
    float64 is within 1 of the true one (relative error ~2^-52 on a value < 2^50), the remainder
    ``a * m - q * n`` is computed exactly in wrapping 64-bit arithmetic, lands in ``[-n, 2n)``; adding
    ``n`` and one unsigned ``np.remainder`` bring it to ``[0, n)``.
    """
    a = np.asarray(a, dtype=np.int64)
    if m * n <= _INT64_MAX:
        out = a * m
        u = out.view(np.uint64)  # non-negative: the unsigned remainder is the same, and faster
        _umod_inplace(u, n)
        return out
    if n > _MULMOD_FLOAT_MAX_N:
        raise ValueError(f"mulmod supports n <= 2^50 when m * n >= 2^63, got n={n}")
    q = a.astype(np.float64)
    np.multiply(q, m / n, out=q)
    np.floor(q, out=q)
    qi = q.astype(np.int64)
    # array (not scalar) integer ops wrap silently modulo 2^64
    r = a.view(np.uint64) * np.uint64(m)
    r -= qi.view(np.uint64) * np.uint64(n)
    r += np.uint64(n)  # a * m - q * n + n in [0, 3n): unsigned from here
    _umod_inplace(r, n)
    return r.view(np.int64)


def zipf_rank_to_id(ranks: np.ndarray, n: int) -> np.ndarray:
    """Bijective rank -> id map ``[1, n] -> [0, n)``: ``(k - 1) * zipf_multiplier(n) mod n``.

    Hot ranks are scattered over the whole id space instead of all sitting at its start; no table of
    size ``n`` is built (it is a permutation in closed form).
    """
    n = int(n)
    m = zipf_multiplier(n)
    ids = np.subtract(ranks, 1, dtype=np.int64)
    if m == 1:
        return ids
    return mulmod(ids, m, n)


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
        _check_zipf_args(alpha, virtual_rows)
        return _draw_zipf(rng, alpha, virtual_rows, int(n), as_ids=True, out=out)
    raise ValueError(f"unknown ids distribution {dist!r} (uniform | zipf)")


# --------------------------------------------------------------------------------------------------
# Virtual -> physical rows
# --------------------------------------------------------------------------------------------------

_SM_GAMMA = np.uint64(SPLITMIX_GAMMA)
_SM_M1 = np.uint64(SPLITMIX_M1)
_SM_M2 = np.uint64(SPLITMIX_M2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 output function (Steele et al.) on uint64, elementwise; wraps modulo 2^64."""
    z = np.asarray(x).astype(np.uint64)  # a copy; int64 -> uint64 keeps the bits (ids are >= 0)
    # array (not scalar) integer ops wrap silently in numpy, which is what the hash wants
    z += _SM_GAMMA
    z ^= z >> _S30
    z *= _SM_M1
    z ^= z >> _S27
    z *= _SM_M2
    z ^= z >> _S31
    return z


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
    _umod_inplace(h, physical_rows)
    return h.view(np.int64)
