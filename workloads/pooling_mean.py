"""The ids per sample a pooling law draws on average: what the estimators count a table's lookups with.

`workloads.data.draw_pooling` draws a law's pooling factors and then rounds and clips them to [min, max], so
the mean it draws is not always the law's parameter: a uniform law's is (min + max) / 2 whatever `mean`
says, a Poisson law clipped below at 1 draws more (mean 4: 4.018), a Pareto law clipped at its max draws less
(mean 8, alpha 2, max 128: 7.85). `expected_pooling` is that mean, exactly (a sum over the pooling factors).
"""
from __future__ import annotations

import math

from workloads.config import PoolingConfig


def expected_pooling(cfg: PoolingConfig, mean: float) -> float:
    """The expectation of one pooling factor `draw_pooling(rng, cfg, mean, n)` draws."""
    dist = cfg.distribution
    if dist == "fixed":
        return float(math.floor(mean + 0.5))
    lo, hi = int(cfg.min), int(cfg.max)
    if dist == "uniform":
        return (lo + hi) / 2.0
    if dist == "poisson":
        return _clipped_poisson_mean(float(mean), lo, hi)
    return _rounded_clipped_pareto_mean(float(mean), float(cfg.pareto_alpha), lo, hi)


def _clipped_poisson_mean(mean: float, lo: int, hi: int) -> float:
    """E[clip(X, lo, hi)] for X ~ Poisson(mean): lo below lo, hi from hi on."""
    if mean <= 0:
        return float(lo)
    total, below = 0.0, 0.0  # sum of k p(k) for lo <= k < hi; P(X < hi)
    for k in range(hi):
        p = math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))
        total += max(k, lo) * p
        below += p
    return total + hi * max(0.0, 1.0 - below)


def _rounded_clipped_pareto_mean(mean: float, alpha: float, lo: int, hi: int) -> float:
    """E[clip(rint(X), lo, hi)] for X classical Pareto of shape `alpha`, scale mean (alpha - 1) / alpha."""
    scale = mean * (alpha - 1.0) / alpha

    def survival(x: float) -> float:  # P(X >= x)
        return 1.0 if x <= scale else (scale / x) ** alpha

    total = 0.0
    for k in range(hi):  # rint(X) = k for X in [k - 1/2, k + 1/2) (ties have probability 0)
        total += max(k, lo) * (survival(k - 0.5) - survival(k + 0.5))
    return total + hi * survival(hi - 0.5)
