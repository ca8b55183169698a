"""The regression gate cannot pass by accident.

A small project of its own (pytester: its pyproject's `membench_suite`, its suite file, its baselines
folder; membench used as the installed plugin) is checked the ways a user starts pytest: `--baseline-dir
DIR` (a value after a space, which makes pytest take DIR as its rootdir), `--baseline-dir=DIR`, from
another folder (`pytest /path/to/project/tests`), and from its root with no option at all. Each runs
every entry of the suite, and each catches the planted regression (one baseline made 20% tighter). Then
the planted regressions of each kind (peak growth, ok -> oom, imbalance), and where the settings come from.
The comparison logic alone, and the repository's suites: test_baseline_compare.py.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.settings import resolve_settings
from bench.results.schema import CATEGORIES

pytest_plugins = ["pytester"]

TEST_FILE = """
def test_memory(membench_entry, membench_check):
    membench_check(membench_entry)
"""
# Cheap entries (plain-PyTorch backend: no torchrec import, one step) for the invocation tests
CHEAP = ["workload=tiny", "model=native", "workload.num_tables=2", "workload.warmup_steps=0", "workload.steps=1"]
ENTRIES = {"fits": CHEAP, "tight": [*CHEAP, "workload.batch_size=256"]}


def suite_yaml(entries) -> str:
    return json.dumps({"name": "t", "hardware": "cpu", "rtol": 0.0,
                       "entries": [{"name": name, "overrides": list(overrides)} for name, overrides in entries.items()]})


def make_project(root: Path, entries, *, suite_setting: bool = True) -> Path:
    """A project that uses membench as a plugin: its own ini, suite file, baselines and runs folders."""
    (root / "tests").mkdir(parents=True, exist_ok=True)
    (root / "tests" / "test_mem.py").write_text(TEST_FILE)
    (root / "mem").mkdir(exist_ok=True)
    (root / "mem" / "suite.yaml").write_text(suite_yaml(entries))
    ini = ['[tool.pytest.ini_options]', 'addopts = "-p no:cacheprovider"']
    if suite_setting:
        ini += ['membench_suite = "mem/suite.yaml"', 'membench_baseline_dir = "mem/baselines"',
                'membench_results_dir = "mem/runs"']
    (root / "pyproject.toml").write_text("\n".join(ini) + "\n")
    return root


def inner_pytest(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def outcomes(output: str) -> dict:
    """{'passed': n, 'failed': n, ...} from pytest's last line."""
    last = [line for line in output.splitlines() if line.strip()][-1]
    counts = {}
    for part in last.strip("= ").split(" in ")[0].split(", "):
        number, _, word = part.partition(" ")
        if number.isdigit() and word in ("passed", "failed", "skipped", "error", "errors", "deselected"):
            counts[word] = int(number)
    return counts


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Baselines and runs of ENTRIES, recorded by the plugin itself (--update-baselines)."""
    root = make_project(tmp_path_factory.mktemp("recorded"), ENTRIES)
    proc = inner_pytest(root, "--update-baselines")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ENTRIES:
        assert f"updated baseline: {name}: new baseline (status ok)" in proc.stdout
    (runs,) = (root / "mem" / "runs").glob("suite-*")
    return {"baselines": root / "mem" / "baselines", "runs": runs}


def planted_baselines(recorded, target: Path, *, other_torch: bool = False) -> Path:
    """The recorded baselines with `tight` made 20% tighter (its largest category shrunk by the same bytes,
    which the failure table must then name as the category that moved most)."""
    shutil.copytree(recorded["baselines"], target, dirs_exist_ok=True)
    path = target / "cpu" / "tight.json"
    baseline = json.loads(path.read_text())
    for rank in baseline["per_rank"]:
        cut = rank["peak_bytes"] - int(rank["peak_bytes"] * 0.8)
        rank["peak_bytes"] -= cut
        rank["utilization"] *= 0.8
        largest = max(rank["breakdown"], key=rank["breakdown"].get)
        rank["breakdown"][largest] -= cut
    if other_torch:
        baseline["environment"]["torch"] = "2.0.0"
    path.write_text(json.dumps(baseline))
    return target


def assert_caught(proc: subprocess.CompletedProcess) -> str:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert outcomes(proc.stdout) == {"passed": 1, "failed": 1}, output
    assert "test_memory[fits] PASSED" in output and "test_memory[tight] FAILED" in output
    # under CI pytest repeats the whole message in the short summary: read the FAILURES section only
    report = output.split("short test summary info")[0]
    failing = [line for line in report.splitlines() if line.startswith("tight ") and "peak_bytes" in line]
    assert len(failing) == 2 and all(line.rstrip().endswith("FAIL") for line in failing), output
    assert all("+25.00%" in line for line in failing), output  # now / (0.8 x now) - 1
    assert "tight: 2 metric(s) over tolerance; worst rank " in report, output
    for line in failing:  # the shrunk category moved by the whole difference
        _, _, _, base, now, delta, _, _, category, category_delta, _ = line.split()
        assert category_delta == delta == f"+{int(now.replace(',', '')) - int(base.replace(',', '')):,}", line
        assert category in CATEGORIES, line
    return output


# -- each way of starting pytest runs every entry and catches the planted regression -----------------------
@pytest.mark.slow
def test_baseline_dir_after_a_space(pytester, recorded, tmp_path):
    make_project(pytester.path, ENTRIES)
    baselines = planted_baselines(recorded, tmp_path / "elsewhere" / "baselines")
    proc = inner_pytest(pytester.path, "-v", "-m", "membench", "--baseline-dir", str(baselines),
                        f"--membench-from-runs={recorded['runs']}")
    assert_caught(proc)


@pytest.mark.slow
def test_baseline_dir_with_equals_and_other_library_versions(pytester, recorded, tmp_path):
    make_project(pytester.path, ENTRIES)
    baselines = planted_baselines(recorded, tmp_path / "baselines", other_torch=True)
    proc = inner_pytest(pytester.path, "-v", "-m", "membench", f"--baseline-dir={baselines}",
                        f"--membench-from-runs={recorded['runs']}")
    output = assert_caught(proc)
    assert "versions differ from the baseline's: torch 2.0.0 -> " in output


@pytest.mark.slow
def test_started_from_another_folder_launches_into_the_projects_results(pytester, recorded, tmp_path):
    project = make_project(pytester.path, ENTRIES)
    planted_baselines(recorded, project / "mem" / "baselines")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = inner_pytest(elsewhere, "-v", str(project / "tests"), "-m", "membench")  # no --membench-from-runs: real runs
    assert_caught(proc)
    (session,) = (project / "mem" / "runs").glob("suite-*")
    assert sorted(p.name for p in session.iterdir()) == ["fits", "tight"]
    assert all((session / name / "summary.json").is_file() for name in ENTRIES)
    assert list(elsewhere.iterdir()) == []  # nothing written relative to where pytest was started


@pytest.mark.slow
def test_other_project_with_its_own_settings_and_no_options(pytester, recorded):
    project = make_project(pytester.path, ENTRIES)
    planted_baselines(recorded, project / "mem" / "baselines")
    assert_caught(inner_pytest(project, "-v", f"--membench-from-runs={recorded['runs']}"))


def test_no_suite_configured_fails_in_one_line_and_never_skips(pytester):
    make_project(pytester.path, ENTRIES, suite_setting=False)
    proc = inner_pytest(pytester.path, "-m", "membench")
    assert proc.returncode == 1, proc.stdout
    assert outcomes(proc.stdout) == {"failed": 1}, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if "no membench suite configured" in line]
    assert lines and "membench_suite" in lines[0] and "--membench-suite" in lines[0]
    assert "skipped" not in proc.stdout


def test_from_runs_refuses_missing_and_foreign_runs(pytester, tmp_path):
    make_project(pytester.path, {"fits": CHEAP})
    (tmp_path / "runs" / "fits").mkdir(parents=True)
    proc = inner_pytest(pytester.path, f"--membench-from-runs={tmp_path / 'runs'}", "--baseline-dir=b",
                        "--update-baselines")
    assert proc.returncode == 1 and "fits: no finished run at" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_from_runs_refuses_a_run_of_another_definition(pytester, recorded):
    make_project(pytester.path, {"fits": [*CHEAP, "workload.batch_size=1024"]})
    proc = inner_pytest(pytester.path, f"--membench-from-runs={recorded['runs']}", "--update-baselines")
    assert proc.returncode == 1, proc.stdout
    assert "fits: the run at" in proc.stdout and "another definition of this entry" in proc.stdout


# -- planted regressions of each kind, one session ------------------------------------------------------------
@pytest.mark.slow
def test_planted_regressions_each_fail_with_their_reason(pytester, recorded):
    # each entry is checked against the baseline of `fits` (two equal tables, one per rank: balanced)
    planted = {"larger_batch": [*CHEAP, "workload.batch_size=2048"],
               "lower_capacity": [*CHEAP, "hardware.capacity_gib=0.0005"],
               "one_big_table": [*CHEAP, "workload.rows_list=[40000,1000]"]}
    project = make_project(pytester.path, planted)
    baselines = project / "mem" / "baselines" / "cpu"
    baselines.mkdir(parents=True)
    baseline = json.loads((recorded["baselines"] / "cpu" / "fits.json").read_text())
    for name in planted:
        (baselines / f"{name}.json").write_text(json.dumps({**baseline, "name": name}))
    proc = inner_pytest(project, "-v")
    output = proc.stdout
    assert outcomes(output) == {"failed": 3}, output
    rows = output.splitlines()
    assert any(line.startswith("larger_batch ") and "peak_bytes" in line and "activations +" in line
               and line.rstrip().endswith("FAIL") for line in rows), output
    assert "larger_batch: baseline was recorded for another definition of this entry" in output
    assert "lower_capacity: status ok -> oom at rank" in output
    assert any(line.startswith("one_big_table ") and "imbalance" in line and line.rstrip().endswith("FAIL")
               for line in rows), output


def test_corrupt_baseline_fails_in_one_line_without_running(pytester):
    project = make_project(pytester.path, {"planted": CHEAP})
    (project / "mem" / "baselines" / "cpu").mkdir(parents=True)
    (project / "mem" / "baselines" / "cpu" / "planted.json").write_text("{ not json")
    proc = inner_pytest(project)
    assert outcomes(proc.stdout) == {"failed": 1}, proc.stdout
    assert "corrupt baseline" in proc.stdout and "planted.json (not valid JSON" in proc.stdout
    assert "regenerate with: pytest -m membench --update-baselines" in proc.stdout
    assert not (project / "mem" / "runs").exists()  # nothing was launched


def test_missing_baseline_says_how_to_create_it(pytester):
    project = make_project(pytester.path, {"planted": CHEAP})
    proc = inner_pytest(project)
    assert outcomes(proc.stdout) == {"failed": 1}, proc.stdout
    assert "no baseline for planted at" in proc.stdout and "--update-baselines" in proc.stdout


def test_bad_suite_file_is_a_usage_error(pytester):
    pytester.makepyfile(test_mem=TEST_FILE)
    (pytester.path / "suite.yaml").write_text("name: x\nhardware: cpu\nentries:\n  - overrides: []\n")
    result = pytester.runpytest_subprocess("--membench-suite=suite.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*entries[[]0[]]: each entry needs a `name`*"])


def test_bad_suite_file_from_the_ini_is_a_one_line_collection_error(pytester):
    project = make_project(pytester.path, {"fits": CHEAP})
    (project / "mem" / "suite.yaml").write_text("name: x\nhardware: cpu\nentries: []\n")
    proc = inner_pytest(project)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, proc.stdout
    assert "`entries` is empty (suite from membench_suite in" in proc.stdout


# -- where the settings come from -------------------------------------------------------------------------------
def test_settings_follow_the_test_files_ini_not_pytests_rootdir(tmp_path):
    project = make_project(tmp_path / "project", ENTRIES)
    test_file = project / "tests" / "test_mem.py"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    no_cli = {"membench_suite": None, "baseline_dir": None, "membench_results_dir": None}
    settings = resolve_settings(no_cli, elsewhere, test_file)
    assert settings.suite_path == project / "mem" / "suite.yaml"
    assert settings.baseline_dir == project / "mem" / "baselines"
    assert settings.results_dir == project / "mem" / "runs"
    assert settings.ini_path == project / "pyproject.toml"
    cli = {**no_cli, "baseline_dir": "b", "membench_suite": "s.yaml"}
    settings = resolve_settings(cli, elsewhere, test_file)
    assert settings.baseline_dir == elsewhere / "b" and settings.suite_path == elsewhere / "s.yaml"
    assert settings.suite_source == "--membench-suite"
    # pytest's own reading of the same file wins (it carries -o overrides)
    settings = resolve_settings(no_cli, elsewhere, test_file, project / "pyproject.toml",
                                {"membench_suite": "other.yaml"})
    assert settings.suite_path == project / "other.yaml"


def test_settings_defaults_without_any_ini(tmp_path):
    (tmp_path / "t").mkdir()
    settings = resolve_settings({}, tmp_path, tmp_path / "t" / "test_x.py")
    assert settings.suite_path is None and settings.baseline_dir == tmp_path / "results" / "baselines"


def test_repo_runs_its_own_suite_whatever_the_rootdir():
    """This repository's gate: the suite comes from pyproject.toml's `membench_suite`, not from addopts."""
    root = Path(__file__).resolve().parent.parent
    settings = resolve_settings({}, Path("/"), root / "tests" / "test_memory_regression.py")
    assert settings.suite_path == root / "conf" / "suite" / "ci_cpu.yaml"
    assert settings.baseline_dir == root / "results" / "baselines"
    assert "--membench-suite" not in (root / "pyproject.toml").read_text()
