"""The bounded Zipf law of synthetic ids, and how its popularity ranks are scattered over the id space.

Over ranks ``1..n``: the top ``ZIPF_EXACT_HEAD`` (K = 32) ranks get their exact discrete mass ``k^-alpha``;
beyond them rank ``k`` gets the mass of ``[k - 1/2, k + 1/2]`` under the continuous power law ``x^-alpha``
(within ``alpha (alpha + 1) / (24 k^2)`` of ``k^-alpha``: < 0.05 % for k > 32 and alpha <= 3); normalized
together. Both generators draw this law: the host one with an alias table (workloads.zipf_alias), the device
one by inverse CDF (`zipf_table`'s constants, workloads.device_data). Rank ``k`` is id
``(k - 1) * zipf_multiplier(n) mod n`` (`zipf_rank_to_id`), a bijection that spreads the hot ranks over the
whole space. Nothing of size ``n`` is allocated, so spaces of 2^62 ranks are fine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from workloads.hashing import umod_inplace

ZIPF_EXACT_HEAD = 32
# |1 - alpha| below which the tail's integrals take their alpha = 1 (logarithmic) form
LOG_FORM_EPS = 1e-9
# Golden-ratio conjugate: a multiplier near phi^-1 * n spreads consecutive ranks evenly (Weyl sequence).
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_INT64_MAX = 2**63 - 1
MULMOD_FLOAT_MAX_N = 2**50


def check_zipf_args(alpha: float, n_ranks: int) -> None:
    if not alpha > 0:
        raise ValueError(f"zipf alpha must be > 0, got {alpha}")
    if n_ranks < 1:
        raise ValueError(f"zipf needs at least one rank, got {n_ranks}")


def tail_mass(alpha: float, lo: float, hi: float) -> float:
    """The integral of ``x^-alpha`` over ``[lo, hi]`` (0 < lo <= hi), as ``lo^b expm1(b D) / b`` with
    ``b = 1 - alpha`` and ``D = log1p((hi - lo) / lo)``: accurate for alpha near 1 (then ``D``) and for
    narrow intervals far out."""
    b = 1.0 - alpha
    d = math.log1p((hi - lo) / lo)
    if abs(b) < LOG_FORM_EPS:
        return d
    return lo**b * math.expm1(b * d) / b


def tail_mass_ratio(x: float, first: float, b: float, log_form: bool) -> float:
    """``g(x) / g(first)`` where ``g(y)`` is the law's mass of ``[y - 1/2, y + 1/2]`` (tail ranks ``x >= first
    >= 2``, ``b = 1 - alpha``): ``g(y) = (y - 1/2)^b expm1(b log1p(1 / (y - 1/2))) / b``. Plain math on scalars:
    numba compiles the same function for the compiled sampler."""
    lx = math.log1p(1.0 / (x - 0.5))
    lf = math.log1p(1.0 / (first - 0.5))
    if log_form:
        return lx / lf
    return math.exp(b * (math.log(x - 0.5) - math.log(first - 0.5))) * math.expm1(b * lx) / math.expm1(b * lf)


@dataclass(frozen=True)
class ZipfTable:
    """The law's inverse-CDF constants (the device generator's draw)."""
    n_ranks: int
    k: int  # ranks 1..k drawn exactly (k = min(n_ranks, ZIPF_EXACT_HEAD))
    head_mass: float  # P(rank <= k); > 1 when there is no tail (n_ranks <= k)
    cdf: np.ndarray  # cdf[r] = P(rank <= r) for r = 0..k, then +inf (len k + 2)
    tail_scale: float  # v * expm1(b D) = u * tail_scale + tail_shift, v = (u - H) / (1 - H)
    tail_shift: float
    inv_b: float  # 1 / b, or 0 for the log form (alpha == 1)
    log_lo: float


@lru_cache(maxsize=1024)
def zipf_table(alpha: float, n_ranks: int) -> ZipfTable:
    """Per-(alpha, n_ranks) constants of the law's inverse CDF: exact over the head, and over the tail (with
    ``b = 1 - alpha``, ``D = log(hi / lo)``, ``[lo, hi] = [K + 1/2, n + 1/2]``, ``v`` uniform on [0, 1))::

        x = lo * exp(log1p(v * expm1(b * D)) / b)        (alpha != 1)
        x = lo * exp(v * D)                              (alpha == 1, the limit b -> 0)

    rounded to the nearest integer."""
    k = min(n_ranks, ZIPF_EXACT_HEAD)
    head_w = np.arange(1, k + 1, dtype=np.float64) ** -alpha
    b = 1.0 - alpha
    lo, hi = k + 0.5, n_ranks + 0.5
    d = math.log1p((hi - lo) / lo)
    log_form = abs(b) < LOG_FORM_EPS
    tail_w = tail_mass(alpha, lo, hi) if n_ranks > k else 0.0
    total = float(head_w.sum()) + tail_w
    cdf = np.concatenate([[0.0], np.cumsum(head_w) / total, [np.inf]])
    # (a steep enough alpha leaves the tail no float64 mass at all: then it is never drawn)
    has_tail = n_ranks > k and cdf[k] < 1.0
    head_mass = float(cdf[k]) if has_tail else 2.0
    if not has_tail:
        cdf[k] = np.inf  # every u in [0, 1) lands at rank <= k, even after rounding in the cumsum
    one_minus_h = 1.0 - head_mass if has_tail else 1.0
    c = d if log_form else math.expm1(b * d)
    return ZipfTable(
        n_ranks=int(n_ranks),
        k=k,
        head_mass=head_mass,
        cdf=cdf,
        tail_scale=c / one_minus_h,
        tail_shift=-head_mass * c / one_minus_h if has_tail else 0.0,
        inv_b=0.0 if log_form else 1.0 / b,
        log_lo=math.log(lo),
    )


# --------------------------------------------------------------------------------------------------
# Ranks -> ids
# --------------------------------------------------------------------------------------------------


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
    if n > MULMOD_FLOAT_MAX_N:
        m = max(1, min(m, _INT64_MAX // n))
    while math.gcd(m, n) != 1:
        m -= 1  # m = 1 is always coprime, so this terminates
    return m


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
        umod_inplace(u, n)
        return out
    if n > MULMOD_FLOAT_MAX_N:
        raise ValueError(f"mulmod supports n <= 2^50 when m * n >= 2^63, got n={n}")
    q = a.astype(np.float64)
    np.multiply(q, m / n, out=q)
    np.floor(q, out=q)
    qi = q.astype(np.int64)
    # array (not scalar) integer ops wrap silently modulo 2^64
    r = a.view(np.uint64) * np.uint64(m)
    r -= qi.view(np.uint64) * np.uint64(n)
    r += np.uint64(n)  # a * m - q * n + n in [0, 3n): unsigned from here
    umod_inplace(r, n)
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


def rank_to_id_scalar(rank: np.int64, n: np.int64, m: np.int64, m_over_n: float) -> np.int64:
    """``zipf_rank_to_id`` for one int64 rank, with ``m = zipf_multiplier(n)`` and ``m_over_n = m / n``: the
    same exact arithmetic as `mulmod` without a division for ``n <= 2^50`` (the float quotient is within one
    of the true one, and two compares correct it); numba compiles it for the compiled sampler."""
    a = rank - 1
    if m == 1:
        return a
    if n > MULMOD_FLOAT_MAX_N:  # (zipf_multiplier keeps a * m < 2^63 there)
        return (a * m) % n
    q = np.int64(math.floor(np.float64(a) * m_over_n))
    r = np.uint64(a) * np.uint64(m) - np.uint64(q) * np.uint64(n) + np.uint64(n)  # in [0, 3n), wrapping
    if r >= np.uint64(n):
        r -= np.uint64(n)
    if r >= np.uint64(n):
        r -= np.uint64(n)
    return np.int64(r)
