"""Every bad input is refused before launch with one line naming the field and the fix."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.run.config import RunConfig
from bench.run.launchspec import checked_run, resolve_launch
from workloads.config import WorkloadConfig
from workloads.units import GIB
from workloads.validate import ConfigError, validate_workload

REPO_ROOT = Path(__file__).resolve().parent.parent


def run_config(**workload) -> RunConfig:
    cfg = RunConfig()
    cfg.hardware.device = "cpu"
    for key, value in workload.items():
        target = cfg.workload
        *path, leaf = key.split("__")
        for part in path:
            target = getattr(target, part)
        setattr(target, leaf, value)
    return cfg


def check(cfg: RunConfig, cuda_devices: int = 0, host_bytes: int = 20 * GIB) -> RunConfig:
    """The resolved config `membench run` would launch (the given one is never changed)."""
    return checked_run(cfg, cuda_devices, available_host_bytes=host_bytes)[0]


WORKLOAD_CASES = [
    ({"num_tables": 0}, "workload.num_tables"),
    ({"rows": 0}, "workload.rows"),
    ({"rows": -5}, "workload.rows"),
    ({"rows_list": [10, 20]}, "workload.rows_list"),  # 8 tables, 2 row counts
    ({"rows_distribution": "zipfian"}, "workload.rows_distribution"),
    ({"rows_distribution": "log_uniform", "rows_min": 100, "rows_max": 10}, "workload.rows_max"),
    ({"embedding_dim": 0}, "workload.embedding_dim"),
    ({"embedding_dim": 30, "dense_arch": [128, 30]}, "workload.embedding_dim"),  # fbgemm alignment
    ({"embedding_dims": [64, 64]}, "workload.embedding_dims"),
    ({"data_type": "int8"}, "workload.data_type"),
    ({"materialize": "half"}, "workload.materialize"),
    ({"num_dense_features": 0}, "workload.num_dense_features"),
    ({"pooling__distribution": "gamma"}, "workload.pooling.distribution"),
    ({"pooling__mean": 0.0}, "workload.pooling.mean"),
    ({"pooling__mean": 100.0}, "workload.pooling.mean"),  # above pooling.max
    ({"pooling__distribution": "pareto", "pooling__pareto_alpha": 1.0}, "workload.pooling.pareto_alpha"),
    ({"ids__zipf_alpha": 0.0}, "workload.ids.zipf_alpha"),
    ({"ids__zipf_alpha": -1.0}, "workload.ids.zipf_alpha"),
    ({"ids__distribution": "normal"}, "workload.ids.distribution"),
    ({"arch": "transformer"}, "workload.arch"),
    ({"dense_arch": [128, 32]}, "workload.dense_arch"),  # must end in the embedding dim
    ({"over_arch": [128, 2]}, "workload.over_arch"),
    ({"embedding_optimizer": "lamb"}, "workload.embedding_optimizer"),
    ({"dense_optimizer": "lamb"}, "workload.dense_optimizer"),
    ({"batch_size": 0}, "workload.batch_size"),
    ({"steps": 0}, "workload.steps"),
    ({"warmup_steps": -1}, "workload.warmup_steps"),
    ({"embedding_lr": 0.0}, "workload.embedding_lr"),
]


@pytest.mark.parametrize("overrides, field", WORKLOAD_CASES, ids=[c[1] + str(i) for i, c in enumerate(WORKLOAD_CASES)])
def test_bad_workload_names_field(overrides, field):
    with pytest.raises(ConfigError) as info:
        check(run_config(**overrides))
    assert info.value.field == field
    message = str(info.value)
    assert "\n" not in message and field in message and ":" in message


def test_valid_default_passes():
    check(run_config())


@pytest.mark.parametrize("sharding_type", ["row_wise", "table_row_wise", "grid_shard"])
def test_cuda_only_sharding_refused_on_cpu(sharding_type):
    cfg = run_config()
    cfg.sharding.type = sharding_type
    with pytest.raises(ConfigError, match="only on CUDA") as info:
        check(cfg)
    assert info.value.field == "sharding.type"


def test_unknown_sharding_type_and_table():
    cfg = run_config()
    cfg.sharding.type = "diagonal"
    with pytest.raises(ConfigError, match="sharding.type"):
        check(cfg)
    cfg = run_config()
    cfg.sharding.per_table = {"t99": "table_wise"}
    with pytest.raises(ConfigError, match="no such table"):
        check(cfg)
    cfg = run_config()
    cfg.sharding.per_table = {"t0": "row_wise"}
    with pytest.raises(ConfigError, match="sharding.per_table.t0"):
        check(cfg)


def test_fused_adam_is_refused_on_cpu_but_not_for_data_parallel():
    cfg = run_config(embedding_optimizer="adam")
    with pytest.raises(ConfigError, match="CPU kernels fuse only") as info:
        check(cfg)
    assert info.value.field == "workload.embedding_optimizer"
    cfg.sharding.type = "data_parallel"
    check(cfg)
    gpu = run_config(embedding_optimizer="adam")
    gpu.hardware.device = "cuda"
    check(gpu, cuda_devices=2)


@pytest.mark.parametrize("kernel", ["fused_uvm", "fused_uvm_caching"])
def test_uvm_kernels_need_cuda_ranks_to_run(kernel):
    cfg = run_config()
    cfg.sharding.compute_kernel = kernel
    with pytest.raises(ConfigError, match="UVM kernels need CUDA ranks to run"):
        check(cfg)


@pytest.mark.parametrize("ratio", [0, 1.5, -0.1, "x"])
def test_a_caching_ratio_outside_0_1_is_one_line_naming_it(ratio):
    cfg = run_config()
    cfg.sharding.caching_ratio = ratio
    with pytest.raises(ConfigError, match=r"^invalid config: sharding.caching_ratio="):
        check(cfg)


def test_cuda_requested_without_gpu():
    cfg = run_config()
    cfg.hardware.device = "cuda"
    with pytest.raises(ConfigError, match="no CUDA device"):
        check(cfg)


def test_auto_hardware_resolves_to_cpu_with_two_ranks_or_all_gpus():
    cfg = RunConfig()
    cpu = resolve_launch(cfg, cuda_devices=0)
    assert (cpu.device_type, cpu.dist_backend, cpu.world_size) == ("cpu", "gloo", 2)
    gpu = resolve_launch(cfg, cuda_devices=4)
    assert (gpu.device_type, gpu.dist_backend, gpu.world_size) == ("cuda", "nccl", 4)


def test_nccl_on_cpu_and_bad_capacity_refused():
    cfg = run_config()
    cfg.hardware.dist_backend = "nccl"
    with pytest.raises(ConfigError, match="nccl needs CUDA"):
        check(cfg)
    cfg = run_config()
    cfg.hardware.capacity_gib = 0
    with pytest.raises(ConfigError, match="hardware.capacity_gib"):
        check(cfg)


def test_tables_too_big_for_host_ram():
    cfg = run_config(rows=50_000_000, embedding_dim=128, dense_arch=[128, 128])  # 8 x 25.6 GB
    with pytest.raises(ConfigError, match="host RAM") as info:
        check(cfg, host_bytes=20 * GIB)
    assert "materialize=scaled" in str(info.value)


def test_plan_only_workload_is_refused_for_training():
    cfg = run_config(materialize="plan_only")
    with pytest.raises(ConfigError, match="cannot be trained"):
        check(cfg)


def test_validate_workload_direct():
    validate_workload(WorkloadConfig())
    with pytest.raises(ConfigError):
        validate_workload(WorkloadConfig(num_tables=-1))


def test_global_batch_must_split_evenly_over_ranks():
    cfg = run_config(global_batch_size=1001)
    with pytest.raises(ConfigError, match="multiple of the world size") as info:
        check(cfg)
    assert info.value.field == "workload.global_batch_size"
    cfg = run_config(global_batch_size=1000)
    assert check(cfg).workload.batch_size == 500
    assert cfg.workload.batch_size == RunConfig().workload.batch_size  # the checked config is not changed


def test_warmup_covers_the_setup_steps(capsys):
    """Steps 1-3 build what is built once (optimizer state, DDP's rebuilt buckets): never measured."""
    from bench.run.config import SETUP_STEPS

    assert SETUP_STEPS == 3
    for asked, resolved in ((0, 3), (1, 3), (3, 3), (5, 5)):
        assert check(run_config(warmup_steps=asked)).workload.warmup_steps == resolved
    assert "workload.warmup_steps 1 -> 3" in capsys.readouterr().out
    with pytest.raises(ConfigError) as info:  # a negative count is still an error, not raised silently
        check(run_config(warmup_steps=-1))
    assert info.value.field == "workload.warmup_steps"


def test_cpu_mode_names_its_choices_and_memtracker_is_cpu_only():
    cfg = run_config()
    cfg.record.cpu_mode = "sampled"
    with pytest.raises(ConfigError, match="one of exact, memtracker") as info:
        check(cfg)
    assert info.value.field == "record.cpu_mode"
    cfg.record.cpu_mode = "memtracker"
    check(cfg)
    from bench.run.execute import compose_run_config

    simulated = compose_run_config(["hardware=h100_80g", "hardware.simulate=true", "record.cpu_mode=memtracker"])
    with pytest.raises(ConfigError, match="CPU ranks only") as info:
        check(simulated)
    assert info.value.field == "record.cpu_mode"


def test_mlperf_preset_embedding_bytes_are_the_exact_sum_of_its_tables():
    from omegaconf import OmegaConf

    from workloads.spec import build_spec

    preset = OmegaConf.load(REPO_ROOT / "conf" / "workload" / "mlperf_dcnv2.yaml")
    workload = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(WorkloadConfig), preset))
    validate_workload(workload)
    spec = build_spec(workload)
    assert len(spec.tables) == 26
    assert spec.virtual_bytes == sum(preset.rows_list) * 128 * 4
    assert spec.physical_bytes <= workload.scaled_max_gib * GIB


@pytest.mark.parametrize("name, terabytes", [("tb_1", 1), ("tb_10", 10), ("tb_100", 100)])
def test_virtual_presets_are_terabyte_scale_and_plan_only(name, terabytes):
    from omegaconf import OmegaConf

    from workloads.spec import build_spec

    preset = OmegaConf.load(REPO_ROOT / "conf" / "workload" / f"{name}.yaml")
    workload = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(WorkloadConfig), preset))
    validate_workload(workload)
    spec = build_spec(workload)
    assert spec.is_plan_only and spec.physical_bytes == 0
    assert 0.9 * terabytes <= spec.virtual_bytes / 1e12 <= 1.1 * terabytes
