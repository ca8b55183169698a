"""membench's memory model inside torchrec's EmbeddingShardingPlanner (bench/planning/torchrec_memory_model.py):
the Python API exactly as docs/torchrec-planner.md shows it, the planner's figure against membench's
prediction, plan mode against the prediction `membench run` makes for the same plan, and the comparison's
bookkeeping."""
from __future__ import annotations

import re

import pytest

from bench.run.execute import compose_run_config
from conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "torchrec-planner.md"
SNIPPET = re.compile(r"<!-- api-example -->\s*```python\n(.*?)```", re.S)


# A shard's storage is its rank's prediction with the shard less the one without it: each rounds once (1 B),
# and a table's mean ids per sample is not a whole number (poisson pooling clipped at 1: 4.018), so each id
# buffer the dry run sizes from it (ids sent, received, kept for the backward, their offsets: six at most)
# rounds its element count once, an int64 id (8 B) each.
SHARD_ROUNDING_BYTES = 1 + 6 * 8


def doc_snippet() -> str:
    (code,) = SNIPPET.findall(DOC.read_text())
    return code


def test_the_python_api_as_the_docs_show_it_plans_with_membench_s_prediction():
    """The docs' lines, run as written: the plan they make puts on every rank what membench predicts for it
    (the planner's reservation + its shards' storage == `predict` of the plan at the upper end of its
    interval, on CPU: to the byte but for the rounding of each shard: `SHARD_ROUNDING_BYTES`)."""
    from bench.planning.estimate import shares_from_plan
    from bench.planning.torchrec_adapter import describe_plan, quiet_planner

    scope: dict = {}
    with quiet_planner():
        exec(compile(doc_snippet(), str(DOC), "exec"), scope)
    memory, plan = scope["memory"], scope["plan"]
    rows = describe_plan(plan)
    assert {row["table"] for row in rows} == {t.name for t in memory.spec.tables}
    world_size = scope["topology"].world_size
    shares = shares_from_plan(rows, memory.spec, world_size)
    predicted = [memory.rank_bytes(share, world_size) for share in shares]
    reservation = memory.storage_reservation()  # the one the planner was given, reserved at plan()
    figure, shards = [reservation.reserved_bytes] * world_size, [0] * world_size
    for row in rows:
        for shard in row["shards"]:
            figure[shard["rank"]] += memory.shard_bytes(row["table"], row["sharding_type"], *shard["sizes"],
                                                        world_size)
            shards[shard["rank"]] += 1
    assert memory.interval_pct > 0
    assert all(abs(f - p) <= n * SHARD_ROUNDING_BYTES + 1 for f, p, n in zip(figure, predicted, shards)), (
        figure, predicted)
    assert reservation.last_reserved_topology.devices[0].storage.ddr == (
        scope["topology"].devices[0].storage.ddr - reservation.reserved_bytes)


def test_a_shard_adds_its_storage_and_the_buffers_of_the_batch_it_serves():
    from bench.planning.torchrec_memory_model import MembenchMemoryModel
    from bench.planning.calibration import prediction_interval
    from workloads.storage import optimizer_state_bytes

    memory = MembenchMemoryModel.from_config(compose_run_config(["workload=tiny", "hardware=cpu", "workload.embedding_optimizer=adam"]))
    table = memory.spec.tables[0]
    rows, dim = table.physical_rows, table.embedding_dim
    storage = rows * dim * table.bytes_per_element + optimizer_state_bytes("adam", rows, dim)
    # its storage, and the buffers of the global batch it serves (pooled output, ids): more than its storage
    added = memory.shard_bytes(table.name, "table_wise", rows, dim, 4)
    assert added > prediction_interval(storage, memory.interval_pct)[1]
    # a wider world: the same shard serves more of the global batch, the rank without it does not
    assert memory.shard_bytes(table.name, "table_wise", rows, dim, 8) > added
    assert memory.reserved_bytes(8) == memory.reserved_bytes(4)
    # half the columns: half the weights, state and pooled values it sends, but every id of the table received
    half = memory.shard_bytes(table.name, "column_wise", rows, dim // 2, 4)
    assert added / 2 < half < added
    assert memory.reserved_bytes(4) > 0
    with pytest.raises(ValueError, match="workload.batch_size=7"):
        memory.check_batch_size(7)


def test_kernels_membench_does_not_model_keep_torchrec_s_estimate():
    """A UVM-cached option is torchrec's to size (docs say so): the estimator leaves it to torchrec's."""
    import torch
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.sharding_plan import get_default_sharders

    from bench.planning.torchrec_adapter import make_topology, quiet_planner
    from bench.planning.torchrec_memory_model import MembenchMemoryModel
    from workloads.model import build_model

    memory = MembenchMemoryModel.from_config(compose_run_config(["workload=tiny", "hardware=h100_80g"]))
    topology = make_topology(2, "cuda", 80 << 30, 1 << 40, 2)
    model = build_model(memory.spec, torch.device("meta"))
    sharders = get_default_sharders()
    with quiet_planner():
        theirs = EmbeddingEnumerator(topology, memory.spec.config.batch_size).enumerate(model, sharders)
        ours = memory.planner_kwargs(topology)["enumerator"].enumerate(model, sharders)

    def storages(options, kernel):
        return {(o.name, o.sharding_type): [s.storage for s in o.shards] for o in options if o.compute_kernel == kernel}

    assert storages(ours, "fused_uvm_caching") == storages(theirs, "fused_uvm_caching") != {}
    fused = [o for o in ours if o.compute_kernel == "fused"]
    assert fused and storages(ours, "fused") != storages(theirs, "fused")
    for option in fused:
        for shard in option.shards:
            assert shard.storage.ddr == 0
            assert shard.storage.hbm == memory.shard_bytes(option.name, option.sharding_type, *shard.size, 2)


@pytest.mark.slow  # 12 s of torchrec plans: out of --quick, in the full suite
def test_plan_with_membench_s_model_predicts_what_run_predicts_for_the_same_plan():
    """`membench plan plan.planner=torchrec plan.memory_model=membench` and the prediction `membench run` makes
    before launch for the plan its ranks will use (the same planner, the same capacity) agree per rank; the
    planner's own figure is that prediction."""
    from bench.planning.predict import predict_run
    from bench.planning.provision import plan
    from bench.run.launchspec import checked_run, resolve_target
    from bench.run.config import with_changes
    from workloads.spec import build_spec

    overrides = ["workload=tiny", "hardware=cpu", "sharding=auto", "plan.planner=torchrec",
                 "plan.memory_model=membench", "workload.num_tables=5", "hardware.capacity_gib=0.25"]
    cfg = compose_run_config(overrides)
    cfg_tables = build_spec(cfg.workload).tables
    outcome = plan(cfg, build_spec(cfg.workload), resolve_target(with_changes(cfg, mode="plan"), visible_cuda=None))
    run_cfg, launch = checked_run(cfg, cuda_devices=0)
    before_launch = predict_run(run_cfg, launch)
    assert [r.peak_bytes for r in outcome.per_rank] == before_launch["per_rank_peak"]
    assert outcome.estimate["planner_per_rank_bytes"] == before_launch["torchrec_per_rank_peak"]
    upper = [high for _, high in before_launch["per_rank_interval"]]  # what the planner plans a rank with
    assert all(abs(f - u) <= len(cfg_tables) * SHARD_ROUNDING_BYTES + 1
               for f, u in zip(outcome.estimate["planner_per_rank_bytes"], upper)), (
        outcome.estimate["planner_per_rank_bytes"], upper)
    assert outcome.estimate["memory_model"] == "membench"


@pytest.mark.parametrize("overrides, field", [
    (["plan.memory_model=heuristic"], "plan.memory_model"),
    (["plan.memory_model=membench"], "plan.memory_model"),  # membench's own planner needs no plug-in
])
def test_a_bad_memory_model_is_one_line_naming_the_field(overrides, field):
    from bench.planning.provision import validate_plan_config
    from workloads.validate import ConfigError

    with pytest.raises(ConfigError) as err:
        validate_plan_config(compose_run_config(overrides).plan, "cpu")
    assert str(err.value).startswith(f"invalid config: {field}=") and "\n" not in str(err.value)


def test_a_run_checks_its_memory_model_before_launch():
    from bench.run.launchspec import checked_run
    from workloads.validate import ConfigError

    with pytest.raises(ConfigError, match="plan.memory_model"):
        checked_run(compose_run_config(["plan.memory_model=heuristic"]), cuda_devices=0)


def test_the_memory_model_enters_the_config_hash_only_when_set():
    from bench.run.config import config_hash

    default = config_hash(compose_run_config([]))
    assert config_hash(compose_run_config(["plan.memory_model=torchrec"])) == default
    assert config_hash(compose_run_config(["plan.memory_model=membench"])) != default


def test_the_comparison_counts_refusals_where_a_plan_fits(tmp_path):
    from bench.harness.planner_comparison import (ModelOutcome, WorkloadComparison, load_comparison, summarize,
                                                  to_json)
    from bench.results.store import atomic_write_json

    def workload(index, torchrec, membench, emulated=False):
        comparison = WorkloadComparison(index, [], 2, emulated, 1000, 900)
        for name, (verdict, unused) in (("torchrec", torchrec), ("membench", membench)):
            comparison.outcomes[name] = ModelOutcome(name, verdict, unused_bytes=unused)
        return comparison

    comparisons = [workload(1, ("refused", None), ("ok", 100)), workload(2, ("oom", None), ("refused", None)),
                   workload(3, ("ok", 300), ("ok", 50)), workload(4, ("refused", None), ("refused", None)),
                   workload(5, ("ok", 10), ("ok", 10), emulated=True)]
    summary = summarize(comparisons)
    assert summary["cpu"]["torchrec"] == {"workloads": 4, "ok": 1, "oom": 1, "failed": 0, "refused": 2,
                                          "refused_although_fits": 1, "unused_median": 0.3, "unused_mean": 0.3}
    assert summary["cpu"]["membench"]["refused_although_fits"] == 0  # the other OOMed: nothing known to fit
    assert summary["cpu"]["membench"]["unused_median"] == 0.075
    assert summary["emulated"]["membench"]["workloads"] == 1
    atomic_write_json(tmp_path / "c.json", to_json(0, comparisons))
    assert load_comparison(tmp_path / "c.json") == comparisons


@pytest.mark.parametrize("argv, said", [(["--count", "0"], "--count 0"), (["--count", "2", "--emulated", "3"],
                                        "--emulated 3"), (["--world-size", "1"], "--world-size 1")])
def test_planner_check_refuses_bad_arguments_in_one_line(argv, said, capsys, tmp_path):
    from bench.apps.planner_check import main

    assert main(argv + ["--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())
