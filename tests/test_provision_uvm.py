"""`membench provision` over cache ratios: each ratio's smallest world size, the limit that binds below it (HBM
or host memory per node), and a search that skips only world sizes that cannot fit."""
from __future__ import annotations

import json

import pytest

from bench.planning import provision as provisioning
from bench.report.figures.cache_ratio import curves
from bench.run.config import with_changes
from bench.run.execute import compose_run_config
from bench.run.launchspec import resolve_target
from workloads.validate import ConfigError

UVM_TB_1 = ["workload=tb_1", "hardware=h100_80g", "sharding.compute_kernel=fused_uvm_caching",
            "hardware.host_memory_gib=256", "hardware.capacity_gib=16",
            "plan.caching_ratios=[0.05,0.5]"]


def provision_config(*overrides: str):
    cfg = with_changes(compose_run_config(list(overrides)), mode="provision")
    return cfg, resolve_target(cfg, visible_cuda=None)


def test_provision_finds_each_cache_ratio_s_world_size_and_what_binds_below_it(monkeypatch, tmp_path):
    """A small cache fits the fewest ranks the nodes' host memory allows (host memory binds one node below); a
    large cache needs more ranks for its HBM (HBM binds). Starting the search at the capacity bound gives the
    same answer as trying every world size from one node up."""
    cfg, target = provision_config(*UVM_TB_1)
    provisioning.validate_caching_ratios(cfg)
    report = provisioning.provision(cfg, target, progress=lambda line: None)
    small, large = report["results"]
    assert (small["caching_ratio"], large["caching_ratio"]) == (0.05, 0.5)
    for row, binding in ((small, "host"), (large, "hbm")):
        chosen, smaller = row["recommended"], row["next_smaller"]
        assert chosen["fits"] and not smaller["fits"] and smaller["binding"] == binding
        assert smaller["world_size"] == chosen["world_size"] - target.ranks_per_node
        assert smaller["shortfall_bytes"] > 0
    assert small["recommended"]["max_node_host_bytes"] <= report["host_capacity_bytes"]
    assert small["recommended"]["world_size"] < large["recommended"]["world_size"]
    assert large["search_from"] > target.ranks_per_node  # the bound skipped world sizes
    path = tmp_path / "provision.json"  # what report figure 11 reads of it
    path.write_text(json.dumps(report))
    cached, _ = curves([path], [])
    assert [(p["caching_ratio"], p["world_size"], p["limit"]) for p in cached[("tb_1", "h100_80g", "membench", 2048)]] \
        == [(0.05, small["recommended"]["world_size"], "host"), (0.5, large["recommended"]["world_size"], "hbm")]
    point_cfg = with_changes(cfg)
    point_cfg.sharding.caching_ratio = 0.5
    monkeypatch.setattr(provisioning, "smallest_world_size", lambda *args: 0)
    every = provisioning.provision_point(point_cfg, target)
    assert every["search_from"] == target.ranks_per_node
    assert every["recommended"] == large["recommended"] and every["next_smaller"] == large["next_smaller"]


@pytest.mark.parametrize("overrides, fix", [
    (["plan.caching_ratios=[0.1]"], "sharding.compute_kernel=fused_uvm_caching"),
    (["sharding.compute_kernel=fused_uvm_caching", "plan.caching_ratios=[0.1,0]"], "(0, 1)"),
    (["sharding.compute_kernel=fused_uvm_caching", "plan.caching_ratios=[0.5,1.0]"], "(0, 1)"),
])
def test_bad_cache_ratios_are_refused_in_one_line_naming_the_field(overrides, fix):
    """A cache ratio of 1.0 was taken, and torchrec's planner then refused every table of every plan ("requires
    cache_load_factor strictly between 0 and 1"), so provision searched to plan.max_world_size."""
    cfg, _ = provision_config("workload=tb_1", "hardware=h100_80g", *overrides)
    with pytest.raises(ConfigError) as err:
        provisioning.validate_caching_ratios(cfg)
    assert "plan.caching_ratios" in str(err.value) and fix in str(err.value) and "\n" not in str(err.value)


def test_a_whole_table_cache_is_refused_for_sharding_caching_ratio_too():
    from workloads.uvm_cache import validate_caching_ratio

    validate_caching_ratio(0.99)
    for bad in (1.0, 1, 0, True):
        with pytest.raises(ConfigError, match="sharding.caching_ratio"):
            validate_caching_ratio(bad)
