"""Results files: atomic writes, strict loading, job statistics."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from bench.results.schema import SCHEMA_VERSION, JobStats, RankResult, RunSummary, job_stats
from bench.results.store import ResultsError, atomic_write_json, load_summary, write_summary


def summary(**kw) -> RunSummary:
    base = dict(run_id="r1", status="ok", mode="train", workload="tiny", hardware="cpu", world_size=2,
                device_type="cpu", device_name="cpu", model_backend="torchrec", config_hash="abc",
                versions={}, started_at="now", wall_s=1.0, exit_code=0)
    base.update(kw)
    return RunSummary(**base)


def rank(r: int, peak: int, times=(0.5, 0.1, 0.3)) -> RankResult:
    return RankResult(rank=r, status="ok", device="cpu", capacity_bytes=1000, peak_bytes=peak,
                      utilization=peak / 1000, step_times_s=list(times))


def test_round_trip(tmp_path):
    original = summary(per_rank=[rank(0, 100), rank(1, 300)], job=JobStats(steps=2))
    write_summary(tmp_path, original)
    assert load_summary(tmp_path) == original
    assert not list(tmp_path.glob("*.tmp"))


def test_unknown_schema_version_is_one_line(tmp_path):
    data = asdict(summary())
    data["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "summary.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=f"schema_version {SCHEMA_VERSION + 1} is not supported") as info:
        load_summary(tmp_path)
    assert "\n" not in str(info.value)


def test_version_1_summaries_are_still_read(tmp_path):
    """Version 2 added the CUDA allocator fields and the rank-peak percentiles; older summaries read them
    as unknown (None)."""
    data = asdict(summary(per_rank=[rank(0, 100)], job=JobStats(steps=2)))
    data["schema_version"] = 1
    for key in ("allocator",):
        del data[key]
    for key in ("peak_bytes_p10", "peak_bytes_p50", "peak_bytes_p90"):
        del data["job"][key]
    del data["per_rank"][0]["allocator"], data["per_rank"][0]["nvml"]
    (tmp_path / "summary.json").write_text(json.dumps(data))
    loaded = load_summary(tmp_path)
    assert loaded.schema_version == 1 and loaded.allocator is None and loaded.job.peak_bytes_p50 is None


def test_rank_peak_percentiles_interpolate_like_numpy():
    import numpy as np

    from bench.results.schema import percentile

    for values in ([5], [1, 9], [3, 1, 4, 1, 5, 9, 2, 6]):
        for q in (10, 50, 90):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None
    stats = job_stats([rank(0, 100), rank(1, 300)], batch_size=1, warmup_steps=0)
    assert (stats.peak_bytes_p10, stats.peak_bytes_p50, stats.peak_bytes_p90) == (120, 200, 280)


@pytest.mark.parametrize("content", ["{not json", "", "[]"])
def test_corrupt_summary(tmp_path, content):
    (tmp_path / "summary.json").write_text(content)
    with pytest.raises(ResultsError):
        load_summary(tmp_path)


def test_atomic_write_keeps_old_file_when_serialisation_fails(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert not list(tmp_path.glob(".x.json.*"))


def test_job_stats_utilization_imbalance_and_step_time():
    stats = job_stats([rank(0, 100, (9.0, 0.1, 0.3)), rank(1, 300, (9.0, 0.2, 0.1))], batch_size=10,
                      warmup_steps=1)
    assert stats.utilization_min == pytest.approx(0.1)
    assert stats.utilization_max == pytest.approx(0.3)
    assert stats.imbalance == pytest.approx(300 / 200)
    assert stats.steps == 2
    # per step the slowest rank counts: (0.2, 0.3) -> median 0.25 s
    assert stats.step_time_ms_p50 == pytest.approx(250)
    assert stats.samples_per_s == pytest.approx(10 * 2 / 0.25)
