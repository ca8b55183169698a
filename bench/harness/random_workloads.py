"""Random workloads from the documented space (docs/running.md, docs/plan.md), for the predictor's generalization check.

`membench calibrate --validate N` runs N of them and scores the peak prediction on each; they are drawn
from a seed (the same seed, the same workloads), never from a suite, so nothing the predictor is
calibrated on is what it is judged on. The space (what issue "Predictions that hold on workloads no one
calibrated on" measured): 2 to 12 tables, dims 16-128, rows 500-150k (fixed or log-uniform), batch
64-1536 per rank, every CPU sharding type, dlrm and dlrm_dcn, every embedding and dense optimizer, every
pooling and id distribution, both backends (alternately, so each gets half), and on torchrec every train
pipeline that runs on CPU (drawn from a generator of its own, so a seed's workloads are the ones it drew before
pipelines were an axis, plus their pipeline). A draw that the run's own validation refuses (e.g. fused Adam on a
sharded CPU table) is drawn again.
"""
from __future__ import annotations

import random
from typing import List, Sequence

from workloads.validate import ConfigError

DIMS = (16, 32, 64, 128)
CPU_SHARDINGS = ("table_wise", "column_wise", "table_column_wise", "data_parallel", "auto")
ARCHS = ("dlrm", "dlrm_dcn")
EMBEDDING_OPTIMIZERS = ("sgd", "rowwise_adagrad", "adam")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
POOLINGS = ("fixed", "uniform", "poisson", "pareto")
BACKENDS = ("torchrec", "native")
CPU_PIPELINES = ("plain", "base", "sparse_dist", "sparse_dist_lite")
MAX_DRAWS = 200


def draw_overrides(rng: random.Random, backend: str) -> List[str]:
    """One workload for `backend` as `membench run` overrides (not yet validated)."""
    dim = rng.choice(DIMS)
    arch = rng.choice(ARCHS)
    tables = rng.randint(2, 12)
    overrides = ["hardware=cpu", "workload=tiny", f"model={backend}", f"workload.num_tables={tables}",
                 f"workload.embedding_dim={dim}", f"workload.dense_arch=[64,{dim}]",
                 f"workload.batch_size={rng.randint(64, 1536)}", f"workload.arch={arch}",
                 f"workload.embedding_optimizer={rng.choice(EMBEDDING_OPTIMIZERS)}",
                 f"workload.dense_optimizer={rng.choice(DENSE_OPTIMIZERS)}", "workload.steps=2"]
    if rng.random() < 0.5:
        overrides.append(f"workload.rows={rng.randint(500, 150_000)}")
    else:
        low = rng.randint(500, 20_000)
        overrides += ["workload.rows_distribution=log_uniform", f"workload.rows_min={low}",
                      f"workload.rows_max={rng.randint(low + 1, 150_000)}"]
    pooling = rng.choice(POOLINGS)
    mean = rng.randint(1, 16)
    overrides += [f"workload.pooling.distribution={pooling}", f"workload.pooling.mean={mean}",
                  "workload.pooling.min=1", f"workload.pooling.max={max(2 * mean, 4)}"]
    if rng.random() < 0.5:
        overrides.append("workload.ids.distribution=uniform")
    else:
        overrides += ["workload.ids.distribution=zipf", f"workload.ids.zipf_alpha={rng.uniform(0.8, 1.4):.2f}"]
    if arch == "dlrm_dcn":
        overrides.append(f"workload.dcn_low_rank_dim={rng.choice((16, 32))}")
    # the native backend places tables whole, one rank each
    overrides.append("sharding=table_wise" if backend == "native" else f"sharding={rng.choice(CPU_SHARDINGS)}")
    return overrides


def is_runnable(overrides: List[str]) -> bool:
    """Does `membench run` accept these overrides on this machine (validated as it would, nothing run)?"""
    from bench.run.execute import compose_run_config
    from bench.run.launchspec import checked_run

    try:
        checked_run(compose_run_config(overrides), cuda_devices=0)
    except ConfigError:
        return False
    return True


def random_workloads(count: int, seed: int, backends: Sequence[str] = BACKENDS) -> List[List[str]]:
    """`count` runnable workloads drawn from `seed`, each as `membench run` overrides, on `backends` in turn
    (by default even ones on torchrec, odd ones on the native backend)."""
    rng = random.Random(seed)
    drawn: List[List[str]] = []
    for index in range(count):
        backend = backends[index % len(backends)]
        for _ in range(MAX_DRAWS):
            overrides = draw_overrides(rng, backend)
            if is_runnable(overrides):
                if backend == "torchrec":  # pipelines drive a DistributedModelParallel
                    overrides.append(f"pipeline={random.Random(f'pipeline:{seed}:{index}').choice(CPU_PIPELINES)}")
                drawn.append(overrides)
                break
        else:
            raise RuntimeError(f"no runnable {backend} workload in {MAX_DRAWS} draws (seed {seed})")
    return drawn
