"""Workloads from per-table statistics: `workload.tables_file` (workloads/tables_file.py)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import REPO_ROOT, membench_here
from workloads.config import IdsConfig, PoolingConfig, WorkloadConfig
from workloads.data import SyntheticBatches, batch_rng, draw_pooling
from workloads.ids import draw_virtual_ids, to_physical
from workloads.zipf_law import zipf_multiplier
from workloads.spec import build_spec
from workloads.id_histogram import HistogramIdsConfig, histogram_bucket_of
from workloads.tables_file import TABLES_DIR, load_tables
from workloads.validate import ConfigError, validate_workload

EXAMPLE = "mlperf_criteo_1tb.csv"
FIELD = "workload.tables_file"


def preset(name: str) -> WorkloadConfig:
    loaded = OmegaConf.load(REPO_ROOT / "conf" / "workload" / f"{name}.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(WorkloadConfig), loaded))


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def shape(t):
    return (t.name, t.virtual_rows, t.embedding_dim, t.pooling_mean, t.pooling, t.ids)


# --------------------------------------------------------------------------------------------------
# Without a file: nothing changes
# --------------------------------------------------------------------------------------------------


def reference_batch(cfg: WorkloadConfig, rank: int, step: int):
    """A batch as SyntheticBatches drew it before per-table laws: the workload's pooling and ids config for
    every table."""
    spec = build_spec(cfg)
    n = cfg.batch_size
    rng = batch_rng(cfg.seed, rank, step, 0)
    dense = rng.standard_normal((n, cfg.num_dense_features), dtype=np.float32)
    labels = (rng.random(n) < 0.5).astype(np.float32)
    lengths, values = [], []
    for i, t in enumerate(spec.tables):
        rng = batch_rng(cfg.seed, rank, step, 1 + i)
        lens = draw_pooling(rng, cfg.pooling, t.pooling_mean, n)
        vids = draw_virtual_ids(rng, cfg.ids, t.virtual_rows, int(lens.sum()))
        lengths.append(lens)
        values.append(to_physical(vids, t.virtual_rows, t.physical_rows))
    return dense, labels, np.concatenate(lengths).astype(np.int32), np.concatenate(values)


@pytest.mark.parametrize("cfg", [
    pytest.param(preset("tiny"), id="tiny"),
    pytest.param(preset("mlperf_dcnv2"), id="mlperf_dcnv2"),
    pytest.param(WorkloadConfig(num_tables=3, rows_list=[10**9, 5000, 7], materialize="scaled",
                                scaled_max_gib=0.001, embedding_dim=16, batch_size=256,
                                pooling=PoolingConfig(distribution="pareto", mean=5, max=50),
                                ids=IdsConfig(distribution="zipf", zipf_alpha=1.3)), id="pareto_zipf"),
    pytest.param(WorkloadConfig(batch_size=128, pooling=PoolingConfig(distribution="uniform", min=0, max=9),
                                ids=IdsConfig(distribution="uniform")), id="uniform_uniform"),
])
def test_batches_without_a_tables_file_are_unchanged(cfg):
    assert cfg.tables_file is None
    sb = SyntheticBatches(build_spec(cfg), rank=1, world_size=2)
    for step in (0, 3):
        dense, labels, lengths, values = reference_batch(cfg, 1, step)
        b = sb.batch(step)
        assert np.array_equal(b.dense_features.numpy(), dense) and np.array_equal(b.labels.numpy(), labels)
        assert np.array_equal(b.lengths.numpy(), lengths) and np.array_equal(b.values.numpy(), values)


def test_tables_carry_the_workload_laws_without_a_file():
    cfg = preset("mlperf_dcnv2")
    for t, mean in zip(build_spec(cfg).tables, cfg.pooling.per_table_mean):
        assert t.pooling == replace(cfg.pooling, mean=float(mean), per_table_mean=[])
        assert t.ids == cfg.ids


# --------------------------------------------------------------------------------------------------
# The MLPerf example reproduces its preset
# --------------------------------------------------------------------------------------------------


def test_example_file_reproduces_the_mlperf_preset():
    mlperf = preset("mlperf_dcnv2")
    expected = build_spec(mlperf).tables
    # a tiny workload given the file (and the preset's materialization) has the preset's tables
    tiny = replace(preset("tiny"), tables_file=EXAMPLE, materialize="scaled", scaled_max_gib=mlperf.scaled_max_gib)
    got = build_spec(tiny).tables
    assert len(got) == 26
    assert [shape(t) for t in got] == [shape(t) for t in expected]
    assert [t.physical_rows for t in got] == [t.physical_rows for t in expected]
    # the preset with its own file: the same tables, the same batches
    with_file = replace(mlperf, tables_file=EXAMPLE)
    validate_workload(with_file)
    assert build_spec(with_file).tables == expected
    a = SyntheticBatches(build_spec(mlperf), rank=0, world_size=2).batch(1)
    b = SyntheticBatches(build_spec(with_file), rank=0, world_size=2).batch(1)
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("dense_features", "lengths", "values", "labels"))
    assert a.keys == b.keys


def test_json_file_reads_like_the_csv(tmp_path):
    csv_tables = load_tables(replace(preset("tiny"), tables_file=EXAMPLE))
    entries = [{"name": t.name, "rows": t.rows, "dim": t.dim, "pooling_mean": t.pooling.mean,
                "pooling_distribution": "fixed", "pooling_min": 1, "pooling_max": 100, "id_distribution": "uniform"}
               for t in csv_tables]
    listed = write(tmp_path, "list.json", json.dumps(entries, indent=2))
    wrapped = write(tmp_path, "wrapped.json", json.dumps({"description": "MLPerf", "tables": entries}, indent=1))
    for path in (listed, wrapped):
        assert [replace(t, line=0) for t in load_tables(replace(preset("tiny"), tables_file=path))] == \
            [replace(t, line=0) for t in csv_tables]


# --------------------------------------------------------------------------------------------------
# Paths, precedence, per-table laws
# --------------------------------------------------------------------------------------------------


def test_relative_paths_try_the_working_directory_then_conf_tables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = replace(preset("tiny"), tables_file=EXAMPLE)
    assert len(build_spec(cfg).tables) == 26  # found in conf/tables/
    assert (TABLES_DIR / EXAMPLE).is_file()
    (tmp_path / EXAMPLE).write_text("name,rows\nmine,1000\n")  # the working directory comes first
    assert [t.name for t in build_spec(cfg).tables] == ["mine"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.csv").write_text("name,rows\na,10\n")
    assert build_spec(replace(cfg, tables_file="sub/x.csv")).tables[0].virtual_rows == 10
    assert build_spec(replace(cfg, tables_file=str(tmp_path / "sub" / "x.csv"))).tables[0].name == "a"


def test_file_overrides_table_fields_and_workload_fills_left_out_columns(tmp_path):
    path = write(tmp_path, "t.csv", "# comment\nname,rows,pooling_mean,zipf_alpha\n\nusers,5000,,\nads,700,2.5,1.2\n")
    cfg = WorkloadConfig(num_tables=5, rows_list=[1, 2, 3, 4, 5], embedding_dims=[8] * 5, embedding_dim=32,
                         dense_arch=[64, 32],
                         pooling=PoolingConfig(distribution="poisson", mean=3, min=0, max=20,
                                               per_table_mean=[1, 2, 3, 4, 5]),
                         ids=IdsConfig(distribution="zipf", zipf_alpha=1.05), tables_file=path)
    validate_workload(cfg)
    users, ads = build_spec(cfg).tables
    assert (users.name, users.feature_name, users.virtual_rows, users.embedding_dim) == ("users", "f0", 5000, 32)
    assert users.pooling == PoolingConfig(distribution="poisson", mean=3.0, min=0, max=20) and users.pooling_mean == 3
    assert users.ids == IdsConfig(distribution="zipf", zipf_alpha=1.05)
    assert (ads.virtual_rows, ads.pooling_mean, ads.pooling.mean, ads.ids.zipf_alpha) == (700, 2.5, 2.5, 1.2)


def test_per_table_pooling_laws_reach_the_batch(tmp_path):
    path = write(tmp_path, "t.csv", "name,rows,pooling_mean,pooling_distribution,pooling_min,pooling_max\n"
                                    "a,1000,7,fixed,,\n"
                                    "b,1000,3,poisson,0,30\n"
                                    "c,1000,3,uniform,2,4\n")
    cfg = WorkloadConfig(batch_size=4000, tables_file=path, pooling=PoolingConfig(distribution="pareto", max=64))
    validate_workload(cfg)
    b = SyntheticBatches(build_spec(cfg), rank=0, world_size=1).batch(0)
    a_len, b_len, c_len = b.lengths.view(3, -1).numpy()
    assert (a_len == 7).all()
    assert abs(b_len.mean() - 3) < 0.15 and b_len.min() == 0 and b_len.var() > 2
    assert set(c_len.tolist()) == {2, 3, 4}


def test_histogram_ids_follow_the_histogram(tmp_path):
    weights = [70, 20, 0, 10]
    path = write(tmp_path, "h.csv", f"name,rows,pooling_mean,pooling_distribution,id_histogram\n"
                                    f"h,1000,16,fixed,{' '.join(map(str, weights))}\n"
                                    f"z,1000,16,fixed,\n")
    cfg = WorkloadConfig(batch_size=8192, tables_file=path, pooling=PoolingConfig(max=64),
                         ids=IdsConfig(distribution="zipf"))
    validate_workload(cfg)
    spec = build_spec(cfg)
    assert spec.tables[0].ids == HistogramIdsConfig(histogram=(70.0, 20.0, 0.0, 10.0))
    assert spec.tables[1].ids.distribution == "zipf"
    sb = SyntheticBatches(spec, rank=0, world_size=1)
    batch = sb.batch(0)
    n = 8192 * 16
    ids = batch.values[:n].numpy()
    assert ((0 <= ids) & (ids < 1000)).all()
    buckets = histogram_bucket_of(ids, 1000, len(weights))
    freq = np.bincount(buckets, minlength=4) / n
    assert np.allclose(freq, np.array(weights) / 100, atol=0.006), freq
    assert freq[2] == 0
    # uniform within a bucket: bucket 0 holds ranks 0..249, each drawn ~0.7 n / 250 times
    ranks = (ids * pow(zipf_multiplier(1000), -1, 1000)) % 1000
    counts = np.bincount(ranks[buckets == 0], minlength=250)[:250]
    expected = 0.7 * n / 250
    assert counts.min() > 0.8 * expected and counts.max() < 1.2 * expected
    # hot ranks are scattered over the ids, not packed at the start
    assert ids[buckets == 0].max() > 900
    # deterministic, and a pure function of (seed, rank, step)
    assert torch.equal(sb.batch(0).values, batch.values)
    assert torch.equal(SyntheticBatches(build_spec(cfg), rank=0, world_size=1).batch(0).values, batch.values)
    assert not torch.equal(sb.batch(1).values, batch.values)


def test_histogram_ids_map_through_the_physical_rows(tmp_path):
    path = write(tmp_path, "h.json", json.dumps([{"name": "big", "rows": 10**10, "id_histogram": [5, 1, 1]}]))
    cfg = WorkloadConfig(tables_file=path, materialize="scaled", scaled_max_gib=0.001, embedding_dim=16,
                         dense_arch=[32, 16], batch_size=2048)
    validate_workload(cfg)
    (table,) = build_spec(cfg).tables
    assert 0 < table.physical_rows < table.virtual_rows
    values = SyntheticBatches(build_spec(cfg), rank=0, world_size=1).batch(0).values.numpy()
    assert values.size and ((0 <= values) & (values < table.physical_rows)).all()


# --------------------------------------------------------------------------------------------------
# Bad files: one line naming the file, the line, the column and the fix
# --------------------------------------------------------------------------------------------------


BAD_FILES = [
    # (file name, text, what the error must say)
    ("t.csv", "name,rowz\na,10\n", ["line 1, column rowz", "unknown column 'rowz'", "did you mean 'rows'"]),
    ("t.csv", "name,dim\na,16\n", ["line 1", "no 'rows' column", "add it"]),
    ("t.csv", "name,rows\na,10\nb,abc\n", ["line 3, column rows", "'abc' is not a positive integer"]),
    ("t.csv", "name,rows\na,-5\n", ["line 2, column rows", "'-5' is not a positive integer"]),
    ("t.csv", "name,rows\na,0\n", ["line 2, column rows", "'0' is not a positive integer"]),
    ("t.csv", "name,rows,pooling_mean\na,10,lots\n", ["line 2, column pooling_mean", "'lots' is not a number"]),
    ("t.csv", "name,rows,pooling_distribution\na,10,gamma\n",
     ["line 2, column pooling_distribution", "unknown distribution 'gamma'", "fixed, uniform, poisson, pareto"]),
    ("t.csv", "name,rows,id_distribution\na,10,normal\n",
     ["line 2, column id_distribution", "unknown distribution 'normal'", "uniform, zipf, histogram"]),
    ("t.csv", "", ["the file is empty"]),
    ("t.csv", "# only a comment\n\n", ["the file is empty"]),
    ("t.csv", "name,rows\n", ["line 1", "no tables"]),
    ("t.csv", "name,rows\na,10\nb,20\na,30\n", ["line 4, column name", "'a' is also the name on line 2"]),
    ("t.csv", "name,rows,id_histogram\na,10,0 0 0\n", ["line 2, column id_histogram", "sum to 0"]),
    ("t.csv", "name,rows,id_histogram\na,10,1 -2\n", ["line 2, column id_histogram, bucket 2", "not a weight >= 0"]),
    ("t.csv", "name,rows,id_histogram\na,3,1 1 1 1\n", ["line 2, column id_histogram", "4 buckets for 3 rows"]),
    ("t.csv", "name,rows,id_distribution,id_histogram\na,10,zipf,1 2\n",
     ["line 2, column id_histogram", "id_distribution is 'zipf'"]),
    ("t.csv", "name,rows,id_distribution\na,10,histogram\n", ["line 2, column id_distribution", "id_histogram"]),
    ("t.csv", "name,rows\na,10,5\n", ["line 2", "3 cells for the 2 columns"]),
    ("t.csv", "name,rows,rows\na,10,5\n", ["line 1, column rows", "appears twice"]),
    ("t.csv", "name,rows,dim\na,10,30\n", ["line 2, column dim", "not a multiple of 4", "use e.g. 32"]),
    ("t.csv", "name,rows\nmy table,10\n", ["line 2, column name", "'my table' is not a table name"]),
    ("t.csv", "name,rows\nitems,10\n", ["line 2, column name", "'items' is taken by torch", "'items_table'"]),
    ("t.csv", "name,rows,pooling_mean\na,10,100\n",
     ["line 2, column pooling_mean", "[pooling_min, pooling_max] = [1, 64]"]),
    ("t.csv", "name,rows,zipf_alpha\na,10,9\n", ["line 2, column zipf_alpha", "not in (0, 5]"]),
    ("t.csv", "name,rows,pooling_distribution,pareto_alpha\na,10,pareto,1\n",
     ["line 2, column pareto_alpha", "1: must be > 1"]),
    ("t.csv", "name,rows,pooling_min,pooling_max,pooling_mean\na,10,5,3,4\n",
     ["line 2, column pooling_max", "3: must be >= max(1, pooling_min) = 5"]),
    ("t.json", '[\n  {"name": "a", "rows": 10},\n  {"name": "b" "rows": 20}\n]\n',
     ["line 3, column 16", "JSON syntax error", "Expecting ',' delimiter"]),
    ("t.json", "", ["the file is empty"]),
    ("t.json", "[]", ["the list of tables is empty"]),
    ("t.json", '[\n {"name": "a", "rows": 10},\n {"name": "b",\n  "rowz": 20}\n]',
     ["line 4, key rowz", "unknown column 'rowz'"]),
    ("t.json", '[\n {"name": "a",\n  "rows": "abc"}\n]', ["line 3, key rows", "'abc' is not a positive integer"]),
    ("t.json", '[\n {"name": "a", "rows": -3}\n]', ["line 2, key rows", "-3 is not a positive integer"]),
    ("t.json", '[\n {"name": "a"}\n]', ["line 2", "no 'rows' key"]),
    ("t.json", '[{"name": "a", "rows": 10},\n {"name": "a", "rows": 10}]',
     ["line 2, key name", "'a' is also the name on line 1"]),
    ("t.json", '[{"name": "a", "rows": 10,\n  "rows": 20}]', ["line 2, key rows", "appears twice"]),
    ("t.json", '{"tables": [{"name": "a", "rows": 10, "id_histogram": [0, 0]}]}', ["line 1, key id_histogram",
                                                                                   "sum to 0"]),
    ("t.json", '{"table": []}', ["unknown key 'table'"]),
    ("t.json", '[{"name": "a", "rows": 10}, 7]', ["table 2 is 7, not an object"]),
    ("t.yaml", "name: a\n", ["unknown format '.yaml'", ".csv or .json"]),
]


@pytest.mark.parametrize("name, text, says", BAD_FILES, ids=[f"{i}-{case[2][-1][:24]}" for i, case in
                                                                enumerate(BAD_FILES)])
def test_bad_files_are_refused_in_one_line(tmp_path, name, text, says):
    path = write(tmp_path, name, text)
    cfg = WorkloadConfig(tables_file=path)
    for check in (validate_workload, build_spec):
        with pytest.raises(ConfigError) as info:
            check(cfg)
        message = str(info.value)
        assert info.value.field == FIELD and "\n" not in message
        assert message.startswith(f"invalid config: {FIELD}={path!r}: ")
        for part in says:
            assert part in message, (part, message)


def test_missing_file_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        validate_workload(WorkloadConfig(tables_file="nope.csv"))
    message = str(info.value)
    assert "\n" not in message and "no such file" in message
    assert str(tmp_path / "nope.csv") in message and str(TABLES_DIR / "nope.csv") in message
    with pytest.raises(ConfigError, match="is not a file"):
        validate_workload(WorkloadConfig(tables_file=str(tmp_path)))


def test_workload_defaults_are_named_when_they_are_the_problem(tmp_path):
    path = write(tmp_path, "t.csv", "name,rows,pooling_mean\na,10,50\n")
    with pytest.raises(ConfigError) as info:
        validate_workload(WorkloadConfig(tables_file=path, pooling=PoolingConfig(max=32)))
    assert "line 2, column pooling_mean" in str(info.value) and "[1, 32]" in str(info.value)
    path = write(tmp_path, "d.csv", "name,rows\na,10\n")
    with pytest.raises(ConfigError) as info:
        validate_workload(WorkloadConfig(tables_file=path, embedding_dim=30))
    assert "workload.embedding_dim: 30 is not a multiple of 4" in str(info.value)


def test_dims_must_agree_and_match_the_dense_arch(tmp_path):
    path = write(tmp_path, "t.csv", "name,rows,dim\na,10,64\nb,10,64\nc,10,32\n")
    with pytest.raises(ConfigError) as info:
        validate_workload(WorkloadConfig(tables_file=path))
    assert "line 4, column dim: dim 32 differs from line 2, column dim's 64" in str(info.value)
    path = write(tmp_path, "u.csv", "name,rows,dim\na,10,32\n")
    with pytest.raises(ConfigError) as info:
        validate_workload(WorkloadConfig(tables_file=path))  # dense_arch [128, 64]
    assert info.value.field == "workload.dense_arch" and "(32, from workload.tables_file)" in str(info.value)


# --------------------------------------------------------------------------------------------------
# Through the CLI
# --------------------------------------------------------------------------------------------------


def plan(capsys, monkeypatch, cwd, results, *overrides):
    monkeypatch.chdir(cwd)
    return membench_here(capsys, "plan", f"results_dir={results}", *overrides)


def test_plan_takes_the_example_from_any_directory(tmp_path, capsys, monkeypatch):
    code, out, err = plan(capsys, monkeypatch, tmp_path, tmp_path / "runs", "workload=mlperf_dcnv2",
                          f"workload.tables_file={EXAMPLE}", "hardware=h100_80g", "world_size=8")
    assert code == 0, out + err
    assert "26 tables" in out


def test_plan_refuses_a_bad_file_in_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "bad.csv").write_text("name,rows\nt0,40000000\nt1,abc\n")
    code, out, err = plan(capsys, monkeypatch, tmp_path, tmp_path / "runs", "workload=mlperf_dcnv2",
                          "workload.tables_file=bad.csv")
    assert code == 2, out + err
    errors = [line for line in err.splitlines() if line.startswith("membench: invalid config")]
    assert errors == ["membench: invalid config: workload.tables_file='bad.csv': line 3, column rows: 'abc' is "
                      "not a positive integer; give the table's row count (e.g. 40000000 or 4e7)"]
