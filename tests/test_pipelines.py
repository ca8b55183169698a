"""The `pipeline=` axis: torchrec's train pipelines driving the model, and the batches they hold in flight."""
from __future__ import annotations

import json

import pytest
import torch

from bench.accounting.live_tensors import LiveTensorTracker
from bench.run.config import config_hash, with_changes
from bench.run.execute import compose_run_config
from bench.run.memory.recorder import IN_FLIGHT, fold_in_flight, in_flight_category
from workloads.pipelines import PIPELINES, PipelineKind, validate_pipeline
from conftest import run_here
from workloads.validate import ConfigError

FIXED = ["hardware=cpu", "sharding=table_wise", "workload.pooling.distribution=fixed", "workload.steps=3"]


# -- quick ---------------------------------------------------------------------------------------------------

def test_plain_keeps_the_hash_its_baselines_were_recorded_with():
    plain = compose_run_config([])
    assert plain.pipeline.name == "plain"
    assert config_hash(plain) == config_hash(compose_run_config(["pipeline=plain"]))
    assert config_hash(plain) != config_hash(compose_run_config(["pipeline=sparse_dist"]))
    # the baseline of tiny_table_wise was recorded before the axis existed
    baseline = json.loads(open("results/baselines/cpu/tiny_table_wise.json").read())
    entry = compose_run_config(baseline["overrides"] + ["hardware=cpu"])
    from bench.run.config import with_setup_steps
    assert config_hash(with_setup_steps(entry)) == baseline["config_hash"]


@pytest.mark.parametrize("name, backend, device, fix", [
    ("sparse", "torchrec", "cpu", "one of plain, base, sparse_dist"),
    ("semi_sync", "torchrec", "cpu", "record_stream"),
    ("fused_sparse_dist", "torchrec", "cpu", "not on CPU ranks"),
    ("base", "native", "cpu", "model=torchrec"),
])
def test_pipelines_a_run_cannot_use_are_refused_in_one_line(name, backend, device, fix):
    with pytest.raises(ConfigError) as err:
        validate_pipeline(name, backend, device)
    message = str(err.value)
    assert "pipeline.name" in message and fix in message and "\n" not in message


def test_every_pipeline_runs_somewhere_and_plain_holds_nothing():
    for name in ("plain", "base", "sparse_dist", "sparse_dist_lite"):
        validate_pipeline(name, "torchrec", "cpu")
    for name in PIPELINES:
        validate_pipeline(name, "torchrec", "cuda")
    plain = PIPELINES["plain"]
    assert all(plain.held(phase) == (0, 0) for phase in ("input", "forward", "backward", "optimizer"))
    # sparse_dist holds more than base at every phase, lite less than base before its optimizer step
    for phase in ("forward", "backward"):
        assert PIPELINES["sparse_dist"].held(phase) > PIPELINES["base"].held(phase)
        assert PIPELINES["sparse_dist_lite"].held(phase) < PIPELINES["base"].held(phase)


def test_in_flight_storages_are_charged_then_settle_as_the_plain_loop_counts_them():
    tracker = LiveTensorTracker(torch.device("cpu"), 1 << 40, rank=0)
    host = torch.from_numpy(__import__("numpy").zeros(100, dtype="int64"))  # made without an op: not seen
    with tracker:
        tracker.category = in_flight_category(7, "made")
        made = torch.ones(10, dtype=torch.int64)
        tracker.category = in_flight_category(7, "dist")
        dist = torch.ones(4, dtype=torch.int64)
        tracker.category = "activations"
    tracker.track_new([host, made], in_flight_category(7, "host"))  # `made` is counted already: it stays
    assert fold_in_flight(tracker.by_category)[IN_FLIGHT] == 800 + 80 + 32
    assert tracker.live_bytes == 912
    tracker.recharge(in_flight_category(7, "made"), "activations")
    tracker.recharge(in_flight_category(7, "host"), None)
    tracker.recharge(in_flight_category(7, "dist"), "comm_buffers")
    assert tracker.live_bytes == 112 and IN_FLIGHT not in fold_in_flight(tracker.by_category)
    assert tracker.by_category == {"activations": 80, "comm_buffers": 32}
    del made, dist  # frees of settled storages still land
    assert tracker.live_bytes == 0


# -- slow: torchrun ------------------------------------------------------------------------------------------

def _ids_and_lengths_bytes(batch) -> int:
    return batch.values.nbytes + batch.lengths.nbytes


def _host_batch_bytes(batch) -> int:
    from workloads.model import to_torchrec_batch
    from bench.run.pipelines import batch_tensors

    return sum(t.untyped_storage().nbytes() for t in batch_tensors(to_torchrec_batch(batch, torch.device("cpu"))))


@pytest.mark.slow
def test_sparse_dist_minus_base_is_exactly_what_sparse_dist_holds_beyond_base(tmp_path):
    """At the backward peak (table-wise, 2 ranks, fixed pooling so every batch is the same size), sparse_dist
    holds beyond base: one more whole batch (i+2), the next batch's input all-to-all (its send copy of this
    rank's ids and lengths, what it received for this rank's tables, and the splits: world x (lengths, values)
    int64), and the trained batch's ids and lengths, which base drops after its forward."""
    summaries = {name: run_here(tmp_path / name, *FIXED, f"pipeline={name}") for name in ("base", "sparse_dist")}
    for summary in summaries.values():
        assert summary["status"] == "ok", summary.get("error")
    from workloads.data import SyntheticBatches
    from workloads.spec import build_spec

    cfg = compose_run_config(FIXED)
    spec = build_spec(cfg.workload)
    world = summaries["base"]["world_size"]
    plan = json.loads((tmp_path / "sparse_dist" / "sharding_plan.json").read_text())
    for base, sparse in zip(summaries["base"]["per_rank"], summaries["sparse_dist"]["per_rank"]):
        rank = base["rank"]
        assert base["peak_phase"] == sparse["peak_phase"] == "backward"
        step = sparse["peak_step"]
        batches = SyntheticBatches(spec, rank, world)
        local_tables = {row["table"] for row in plan if rank in row["ranks"]}
        received = sum(SyntheticBatches(spec, r, world).batch(step + 1).batch_size for r in range(world)) * sum(
            int(t.pooling_mean) * 8 + 4 for t in spec.tables if t.name in local_tables)
        next_dist = _ids_and_lengths_bytes(batches.batch(step + 1)) + received + world * 2 * 8
        one_more_batch = _host_batch_bytes(batches.batch(step + 2))
        trained_batch_kept = _ids_and_lengths_bytes(batches.batch(step))
        assert (sparse["breakdown"][IN_FLIGHT] - base["breakdown"][IN_FLIGHT]
                == one_more_batch + next_dist)
        assert sparse["peak_bytes"] - base["peak_bytes"] == one_more_batch + next_dist + trained_batch_kept
        # base holds exactly one whole batch: the next one
        assert base["breakdown"][IN_FLIGHT] == _host_batch_bytes(batches.batch(step + 1))
        for category in ("embedding_weights", "embedding_optimizer", "dense_params", "dense_grads",
                         "dense_optimizer"):
            assert sparse["breakdown"][category] == base["breakdown"][category], category


@pytest.mark.slow
def test_plain_holds_nothing_in_flight_and_lite_nothing_at_its_backward_peak(tmp_path):
    plain = run_here(tmp_path / "plain", *FIXED)
    lite = run_here(tmp_path / "lite", *FIXED, "pipeline=sparse_dist_lite")
    for summary in (plain, lite):
        assert summary["status"] == "ok", summary.get("error")
        for rank in summary["per_rank"]:
            assert rank["breakdown"][IN_FLIGHT] == 0 and rank["peak_phase"] == "backward"
            assert sum(rank["breakdown"].values()) == rank["peak_bytes"]
    rows = (tmp_path / "lite" / "timeline_rank0.csv").read_text().splitlines()
    assert {row.split(",")[2] for row in rows[1:]} == {"build", "input", "forward", "backward", "optimizer"}


def test_pipeline_kind_records_are_complete():
    for kind in PIPELINES.values():
        assert isinstance(kind, PipelineKind) and kind.holds
        assert set(kind.held_by_phase) == {"input", "forward", "backward", "optimizer"}
    assert with_changes(compose_run_config([]), mode="plan").pipeline.name == "plain"


def test_torchrec_permutes_the_input_features_unless_its_shardings_keep_the_batch_s_order():
    """torchrec 1.8 (`_create_input_dist`): the features in its shardings' order (per sharding type, rank by
    rank, once per shard) against the batch's; only a permute makes the send copy the pipelines hold."""
    from bench.planning.estimate import input_features_permuted
    from workloads.config import WorkloadConfig
    from workloads.spec import build_spec

    spec = build_spec(WorkloadConfig(num_tables=3))
    names = [t.name for t in spec.tables]

    def rows(*placed):
        return [{"table": name, "sharding_type": kind, "shards": [{"rank": r} for r in ranks]}
                for name, (kind, ranks) in zip(names, placed)]

    tw = "table_wise"
    assert not input_features_permuted(rows((tw, [0]), (tw, [0]), (tw, [2])), spec, 4)  # in rank order
    assert input_features_permuted(rows((tw, [1]), (tw, [0]), (tw, [2])), spec, 4)
    assert input_features_permuted(rows(("column_wise", [0, 1]), (tw, [2]), (tw, [3])), spec, 4)  # twice
    assert not input_features_permuted(rows(("column_wise", [0]), ("column_wise", [1]), ("column_wise", [1])),
                                       spec, 2)
    # data-parallel first, then table-wise: grouped by type where each type's first table is
    assert not input_features_permuted(rows(("data_parallel", []), (tw, [0]), (tw, [1])), spec, 2)
    assert input_features_permuted(rows((tw, [0]), ("data_parallel", []), (tw, [1])), spec, 2)
    assert input_features_permuted(rows(("row_wise", [0, 1]), (tw, [0]), (tw, [1])), spec, 2)  # not modelled
