"""Unit tests of the device-side synthetic input stream (workloads/device_data.py), run on device='cpu'."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workloads.config import IdsConfig, PoolingConfig, WorkloadConfig
from workloads.device_data import (
    DeviceSyntheticBatches,
    _mulmod,
    batch_seed,
    rank_to_id_t,
    splitmix64_t,
    to_physical_t,
    zipf_ranks_t,
)
from workloads.hashing import splitmix64
from workloads.ids import to_physical
from workloads.zipf_law import ZIPF_EXACT_HEAD, zipf_rank_to_id, zipf_table
from workloads.spec import build_spec

FIELDS = ("dense_features", "lengths", "values", "labels")


def make(rank: int = 0, world_size: int = 2, **kw) -> DeviceSyntheticBatches:
    kw.setdefault("batch_size", 64)
    return DeviceSyntheticBatches(build_spec(WorkloadConfig(**kw)), rank=rank, world_size=world_size, device="cpu")


def zipf_law_pmf(alpha: float, n: int) -> np.ndarray:
    k_head = min(n, ZIPF_EXACT_HEAD)
    w = np.arange(1, k_head + 1, dtype=np.float64) ** -alpha
    if n > k_head:
        edges = np.arange(k_head + 0.5, n + 1.0, 1.0)
        mass = np.diff(np.log(edges)) if abs(alpha - 1) < 1e-12 else np.diff(edges ** (1 - alpha)) / (1 - alpha)
        w = np.concatenate([w, mass])
    return w / w.sum()


def test_batch_is_a_pure_function_of_seed_rank_step():
    a = make(rank=1, seed=7).batch(3)
    other = make(rank=1, world_size=4, seed=7)
    other.batch(0)
    other.batch(5)
    b = other.batch(3)
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    for c in (make(rank=0, seed=7).batch(3), make(rank=1, seed=7).batch(4), make(rank=1, seed=8).batch(3)):
        assert not torch.equal(a.values, c.values) and not torch.equal(a.dense_features, c.dense_features)
    assert len({batch_seed(0, 0, 0), batch_seed(0, 0, 1), batch_seed(0, 1, 0), batch_seed(1, 0, 0)}) == 4
    with pytest.raises(ValueError):
        batch_seed(0, -1, 0)


@pytest.mark.parametrize("pooling", [
    PoolingConfig(distribution="fixed"),
    PoolingConfig(distribution="uniform", min=0, max=9),
    PoolingConfig(distribution="poisson", mean=6, max=40),
    PoolingConfig(distribution="pareto", pareto_alpha=2.5, mean=5, max=200),
])
@pytest.mark.parametrize("ids", ["zipf", "uniform"])
def test_layout_dtypes_and_physical_range(pooling, ids):
    cfg = WorkloadConfig(num_tables=4, rows_list=[10**10, 10**7, 5_000, 123], materialize="scaled",
                         scaled_max_gib=0.001, embedding_dim=16, batch_size=512, num_dense_features=13,
                         ids=IdsConfig(distribution=ids), pooling=pooling)
    spec = build_spec(cfg)
    b = DeviceSyntheticBatches(spec, rank=0, world_size=1).batch(0)
    assert b.keys == [f"f{i}" for i in range(4)]
    assert b.dense_features.dtype == torch.float32 and b.dense_features.shape == (512, 13)
    assert b.labels.dtype == torch.float32 and set(b.labels.unique().tolist()) <= {0.0, 1.0}
    assert b.lengths.dtype == torch.int32 and b.lengths.shape == (4 * 512,)
    assert b.values.dtype == torch.int64 and int(b.lengths.sum()) == b.values.numel()
    offsets = np.concatenate([[0], np.cumsum(b.lengths.view(4, -1).sum(dim=1).numpy())])
    for i, t in enumerate(spec.tables):
        v = b.values[offsets[i] : offsets[i + 1]]
        assert v.numel() == 0 or (int(v.min()) >= 0 and int(v.max()) < t.physical_rows), t
        lens = b.lengths.view(4, -1)[i]
        if pooling.distribution != "fixed":
            assert int(lens.min()) >= pooling.min and int(lens.max()) <= pooling.max


def test_pooling_statistics():
    n = 50_000
    for pooling, mean, var in [(PoolingConfig(distribution="uniform", min=2, max=10), 6.0, None),
                               (PoolingConfig(distribution="poisson", mean=8, min=0, max=200), 8.0, 8.0),
                               (PoolingConfig(distribution="pareto", pareto_alpha=4.0, mean=8, min=1, max=10_000), 8.0, None)]:
        lens = make(num_tables=1, batch_size=n, pooling=pooling).batch(0).lengths.double()
        assert abs(float(lens.mean()) - mean) / mean < 0.05, pooling
        if var is not None:
            assert abs(float(lens.var()) - var) / var < 0.1
    fixed = make(num_tables=2, pooling=PoolingConfig(distribution="fixed", per_table_mean=[3.0, 100.0])).batch(0)
    assert fixed.lengths.view(2, -1)[0].eq(3).all() and fixed.lengths.view(2, -1)[1].eq(100).all()


@pytest.mark.parametrize("alpha,n", [(1.05, 10_000), (0.7, 200), (2.0, 5_000), (1.0, 50_000)])
def test_zipf_law_matches_the_numpy_generators_law(alpha, n):
    # the same law as workloads.ids: exact head frequencies, and the binned tail, against the analytic pmf
    samples = 2_000_000
    g = torch.Generator().manual_seed(5)
    u = torch.rand(samples, generator=g, dtype=torch.float64)
    tab = zipf_table(alpha, n)
    ranks = zipf_ranks_t(u, tab, torch.tensor(tab.cdf[1 : tab.k + 1])).numpy()
    assert ranks.min() >= 1 and ranks.max() <= n
    p = zipf_law_pmf(alpha, n)
    freq = np.bincount(ranks, minlength=n + 1)[1:] / samples
    head = min(n, ZIPF_EXACT_HEAD)
    sigma = np.sqrt(p[:head] * (1 - p[:head]) / samples)
    assert np.all(np.abs(freq[:head] - p[:head]) < 5 * sigma + 1e-4 * p[:head])
    # the tail in 20 bins of equal expected mass: chi-square (Wilson-Hilferty z < 4)
    if n > head:
        cdf = np.cumsum(p[head:]) / p[head:].sum()
        edges = np.searchsorted(cdf, np.linspace(0, 1, 21)[1:-1])
        obs = np.add.reduceat(freq[head:] * samples, np.concatenate([[0], edges]))
        exp = np.add.reduceat(p[head:] * samples, np.concatenate([[0], edges]))
        chi2, dof = float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1
        z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
        assert z < 4, (chi2, dof)


def test_batch_zipf_ids_are_skewed_and_uniform_ids_are_not():
    def top_share(ids):
        b = make(num_tables=1, rows=1000, batch_size=50_000, ids=IdsConfig(distribution=ids)).batch(0)
        counts = np.sort(np.bincount(b.values.numpy(), minlength=1000))[::-1]
        return counts[:10].sum() / counts.sum()

    p = zipf_law_pmf(1.05, 1000)
    assert abs(top_share("zipf") - p[:10].sum()) < 0.01
    assert top_share("uniform") < 0.02


@pytest.mark.parametrize("n", [7, 10**6, 10**10, 2**40 - 3, 2**50, 2**60 + 1])
def test_int64_arithmetic_matches_numpy(n):
    rng = np.random.default_rng(n % 97)
    a = np.concatenate([rng.integers(0, n, 5000), [0, 1, n - 1]]).astype(np.int64)
    for m in {1, max(1, n // 3), n - 1}:
        want = [(int(x) * m) % n for x in a.tolist()]
        assert _mulmod(torch.from_numpy(a), m, n).tolist() == want, (n, m)
    if n <= 2**50:
        ranks = torch.from_numpy(np.minimum(a, n - 1) + 1)
        assert np.array_equal(rank_to_id_t(ranks, n).numpy(), zipf_rank_to_id(ranks.numpy(), n))
    x = torch.from_numpy(a)
    assert np.array_equal(splitmix64_t(x).numpy().view(np.uint64), splitmix64(a))
    for phys in (1000, 12_345_677, 2**33 + 5):
        if phys < n:
            assert np.array_equal(to_physical_t(x, n, phys).numpy(), to_physical(a, n, phys)), phys
    assert torch.equal(to_physical_t(x, n, n), x)
    with pytest.raises(ValueError, match="2\\^61"):
        _mulmod(x, 2**62 // 3, 2**62)


def test_unsupported_laws_are_refused_by_name():
    with pytest.raises(ValueError, match="workload.pooling.distribution"):
        make(pooling=PoolingConfig(distribution="zipf"))
    with pytest.raises(ValueError, match="workload.ids.distribution"):
        make(ids=IdsConfig(distribution="normal"))
    with pytest.raises(ValueError, match="plan_only"):
        make(materialize="plan_only")
    with pytest.raises(ValueError):
        make(rank=2, world_size=2)


def test_device_is_honoured():
    gen = make()
    assert gen.device == torch.device("cpu")
    b = gen.batch(0)
    assert all(getattr(b, f).device.type == "cpu" for f in FIELDS)


def test_gpu_check_rate_probe_skips_without_cuda_and_measures_on_cpu():
    from bench.gpucheck.data_rate import data_rate_probe, device_generator_rate
    from bench.gpucheck.log import CheckLog

    log = CheckLog()
    data_rate_probe(torch.device("cpu"), log)
    (check,) = log.checks
    assert check.verdict == "SKIP" and check.name == "device batch generator rate"
    assert device_generator_rate(torch.device("cpu"), batches=1) > 0


def test_worker_draws_on_the_gpu_by_default_and_on_the_host_for_histograms():
    from bench.run.worker import draws_on_device, make_batches
    from workloads.config import WorkloadConfig
    from workloads.data import SyntheticBatches
    from workloads.device_data import DeviceSyntheticBatches
    from workloads.spec import build_spec

    spec = build_spec(WorkloadConfig())
    assert draws_on_device("auto", "cuda", spec) and not draws_on_device("auto", "cpu", spec)
    assert draws_on_device("device", "cpu", spec) and not draws_on_device("host", "cuda", spec)
    histogram = [t for t in spec.tables]
    object.__setattr__(histogram[0], "ids", type(histogram[0].ids)(distribution="histogram"))
    assert not draws_on_device("auto", "cuda", spec)
    cpu = torch.device("cpu")
    assert isinstance(make_batches("device", build_spec(WorkloadConfig()), 0, 2, cpu), DeviceSyntheticBatches)
    assert isinstance(make_batches("auto", build_spec(WorkloadConfig()), 0, 2, cpu), SyntheticBatches)
