"""Measured terms handed back to torchrec's planner (bench/planning/measured_terms.py, torchrec_measured.py,
`membench reservation`): the split of a run's breakdown, the file and its one-line errors, the config checks,
and, on a run measured here, the reservation the docs' lines give torchrec's planner."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.planning.measured_terms import (FORMAT, RESERVATION_FILE, MeasuredTerms, load_terms, measured_terms)
from bench.results.schema import CATEGORIES, RankResult, RunSummary, complete_breakdown
from bench.results.store import ResultsError
from bench.run.execute import compose_run_config
from conftest import REPO_ROOT, run_here

DOC = REPO_ROOT / "docs" / "torchrec-planner.md"
SNIPPET = re.compile(r"<!-- measured-example -->\s*```python\n(.*?)```", re.S)


def summary_of(breakdowns, status="ok") -> RunSummary:
    ranks = [RankResult(rank=i, status=status, device="cpu", capacity_bytes=1 << 30, peak_bytes=sum(b.values()),
                        breakdown=complete_breakdown(sum(b.values()), b)) for i, b in enumerate(breakdowns)]
    return RunSummary(run_id="r", status=status, mode="train", workload="tiny", hardware="cpu",
                      world_size=len(ranks), device_type="cpu", device_name="cpu", model_backend="torchrec",
                      config_hash="h", versions={}, started_at="", wall_s=0.0, exit_code=0, per_rank=ranks)


def test_every_category_is_in_exactly_one_term():
    from bench.planning import measured_terms as terms

    groups = (terms.TABLE_CATEGORIES, terms.STATIC_CATEGORIES, terms.BATCH_CATEGORIES, terms.OVERHEAD_CATEGORIES)
    assert sorted(c for group in groups for c in group) == sorted(CATEGORIES)


def test_each_term_is_the_largest_over_the_ranks_and_the_activation_term_scales_with_the_batch():
    summary = summary_of([{"embedding_weights": 1000, "dense_params": 10, "dense_optimizer": 20, "activations": 300},
                          {"embedding_weights": 500, "dense_params": 10, "dense_optimizer": 20, "activations": 401,
                           "comm_buffers": 99, "non_torch": 7}])
    terms = measured_terms(summary, batch_size=100)
    assert (terms.static_base_bytes, terms.activation_bytes, terms.runtime_overhead_bytes, terms.table_bytes) == (
        30, 500, 7, 1000)
    assert terms.reserved_bytes(100) == 30 + 500 + 7
    assert terms.reserved_bytes(300) == 30 + 1500 + 7
    assert terms.activation_bytes_at(1) == 5  # rounded up, never below the measured share
    with pytest.raises(ResultsError, match="status 'oom'"):
        measured_terms(summary_of([{"dense_params": 1}], status="oom"), batch_size=8)


def test_the_file_round_trips_and_a_bad_field_is_one_line_naming_it(tmp_path):
    terms = MeasuredTerms("r", "tiny", "h", "cpu", 2, 64, 10, 640, 3, 99)
    path = terms.write(tmp_path / RESERVATION_FILE)
    assert load_terms(path) == terms
    good = json.loads(path.read_text())
    for change, field in (({"static_base_bytes": -1}, "static_base_bytes"), ({"batch_size": 0}, "batch_size"),
                          ({"activation_bytes": True}, "activation_bytes"), ({"format": "x"}, "format"),
                          ({"extra": 1}, "unknown fields"), ({"world_size": 2.5}, "world_size")):
        path.write_text(json.dumps({**good, **change}))
        with pytest.raises(ResultsError, match=field) as err:
            load_terms(path)
        assert "\n" not in str(err.value)
    path.write_text(json.dumps({k: v for k, v in good.items() if k != "table_bytes"}))
    with pytest.raises(ResultsError, match="missing fields .*table_bytes"):
        load_terms(path)


@pytest.mark.parametrize("extra, fix", [
    (["plan.memory_model=membench"], "has its own reservation"),
    (["hardware=h100_80g"], "measured on cpu ranks"),
    (["plan.planner=membench"], "add plan.planner=torchrec"),
])
def test_a_reservation_file_the_plan_cannot_use_is_refused_in_one_line(tmp_path, extra, fix):
    from bench.planning.provision import validate_plan_config
    from workloads.validate import ConfigError

    path = MeasuredTerms("r", "tiny", "h", "cpu", 2, 64, 10, 640, 3, 99).write(tmp_path / RESERVATION_FILE)
    cfg = compose_run_config(["workload=tiny", "plan.planner=torchrec", f"plan.reservation_file={path}", *extra])
    device = "cuda" if "hardware=h100_80g" in extra else "cpu"
    validate_plan_config(compose_run_config(["workload=tiny", "plan.planner=torchrec"]).plan, "cpu")
    with pytest.raises(ConfigError, match=fix) as err:
        validate_plan_config(cfg.plan, device)
    assert str(err.value).startswith("invalid config: plan.reservation_file=")


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory) -> Path:
    """One emulated rank of a 2-rank data-parallel torchrec run (its ranks are alike), and its reservation file
    written by the command."""
    from bench.apps.reservation import main

    run_dir = tmp_path_factory.mktemp("measured") / "run"
    run_here(run_dir, "workload=tiny", "model=torchrec", "hardware=cpu", "sharding=data_parallel",
             "emulate.world_size=2", "workload.steps=2")
    assert main([str(run_dir)]) == 0
    return run_dir


def test_the_terms_and_the_tables_are_the_measured_peak(measured_run):
    summary = json.loads((measured_run / "summary.json").read_text())
    (rank,) = summary["per_rank"]
    terms = load_terms(measured_run / RESERVATION_FILE)
    assert terms.format == FORMAT and terms.batch_size == compose_run_config(["workload=tiny"]).workload.batch_size
    assert terms.reserved_bytes(terms.batch_size) + terms.table_bytes == rank["peak_bytes"]
    assert terms.static_base_bytes == sum(rank["breakdown"][c] for c in ("dense_params", "dense_grads",
                                                                         "dense_optimizer"))


def plan_with(reservation_file, capacity: int):
    """torchrec's plan of the measured workload on 2 CPU ranks of `capacity` bytes, with the docs' lines (None:
    torchrec's heuristic reservation); PlannerError when it refuses."""
    import torch
    from torchrec.distributed.sharding_plan import get_default_sharders

    from bench.planning.torchrec_adapter import quiet_planner
    from workloads.model import build_model
    from workloads.spec import build_spec

    spec = build_spec(compose_run_config(["workload=tiny"]).workload)
    scope = {"reservation_file": reservation_file, "capacity": capacity, "batch_size": spec.config.batch_size}
    code = SNIPPET.findall(DOC.read_text())[0]
    if reservation_file is None:
        code = code.replace("storage_reservation=reservation", "").replace(
            "reservation = MeasuredStorageReservation.from_file(reservation_file)", "reservation = None")
    with quiet_planner():
        exec(compile(code, str(DOC), "exec"), scope)
        scope["planner"].plan(build_model(spec, torch.device("meta")), get_default_sharders())
    return scope["reservation"]


def test_the_planner_with_the_measured_reservation_refuses_what_the_heuristic_accepts(measured_run):
    """The docs' lines, run as written: on ranks 1 MiB larger than the measured reservation (room for no table)
    torchrec's heuristic reservation (its dense and KJT terms, a few MiB) still plans, the measured one refuses;
    with room for the tables it plans, and reserves the terms at the planner's batch."""
    from torchrec.distributed.planner.types import PlannerError

    terms = load_terms(measured_run / RESERVATION_FILE)
    reserved = terms.reserved_bytes(terms.batch_size)
    plan_with(None, reserved + (1 << 20))
    with pytest.raises(PlannerError):
        plan_with(measured_run / RESERVATION_FILE, reserved + (1 << 20))
    reservation = plan_with(measured_run / RESERVATION_FILE, reserved + terms.table_bytes)
    assert reservation.reserved_bytes == reserved


def test_plan_mode_plans_with_the_measured_reservation(measured_run):
    from bench.planning.provision import plan
    from bench.run.config import with_changes
    from bench.run.launchspec import resolve_target
    from workloads.spec import build_spec

    cfg = compose_run_config(["workload=tiny", "hardware=cpu", "plan.planner=torchrec",
                              f"plan.reservation_file={measured_run / RESERVATION_FILE}"])
    outcome = plan(cfg, build_spec(cfg.workload), resolve_target(with_changes(cfg, mode="plan"), visible_cuda=None))
    reserved = load_terms(measured_run / RESERVATION_FILE).reserved_bytes(cfg.workload.batch_size)
    placement = outcome.estimate["placement"]
    assert outcome.estimate["memory_model"] == "torchrec+measured_reservation"
    assert outcome.estimate["planner_per_rank_bytes"] == [
        reserved + hbm + ddr for hbm, ddr in zip(placement["per_rank_hbm_bytes"], placement["per_rank_ddr_bytes"])]
