"""pytest plugin: memory regression tests against stored baselines (registered as `pytest11`).

Settings (command line, or ini options in the project's pytest config; see bench.plugin_settings):
`--membench-suite FILE` / `membench_suite`, `--baseline-dir DIR` / `membench_baseline_dir`,
`--membench-results-dir DIR` / `membench_results_dir`, plus `--update-baselines`, `--membench-rtol X` and
`--membench-from-runs DIR` (check or promote the runs of an earlier session instead of launching).
A test asks for `membench_entry` (parametrized over the suite's entries, marked `membench`) and calls
`membench_check(membench_entry)`:

    def test_memory(membench_entry, membench_check):
        membench_check(membench_entry)

Each entry runs once per session (its own torchrun); `membench_run(entry)` hands other tests that run (its
summary and directory), and `membench_entries` the suite's entries by name. Selected membench tests with no suite configured
fail with one line naming the fix; they never skip, so a gate cannot go green by running nothing.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from bench.harness.baseline import (
    BaselineError,
    baseline_path,
    compare,
    describe_update,
    format_comparison,
    load_baseline,
    make_baseline,
    write_baseline,
)
from bench.harness.settings import NO_SUITE_FIX, SETTINGS, PluginSettings, resolve_settings
from bench.results.store import ResultsError, load_summary
from bench.results.schema import RunSummary
from bench.harness.suite import Suite, SuiteEntry, SuiteError, load_suite

STATE_KEY = pytest.StashKey["SessionState"]()


@dataclass(frozen=True)
class SelectedEntry:
    """A suite entry as handed to a test: the entry and the settings it is checked under."""
    entry: SuiteEntry
    suite: Suite
    settings: PluginSettings

    @property
    def name(self) -> str:
        return self.entry.name


@dataclass(frozen=True)
class MissingSuite:
    """Stands in for the entries when no suite is configured: the test fails with `message`."""
    message: str


# Lines for the terminal summary travel on the test report (user_properties), so that they reach the
# controlling process under pytest-xdist too
NOTE, UPDATE = "membench_note", "membench_update"


class SessionState:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.summaries: Dict[Path, RunSummary] = {}
        self.suites: Dict[Path, Suite] = {}
        self.notes: List[str] = []
        self.updates: List[str] = []
        # one folder per session, unique even for sessions started in the same second
        self.session_name = f"suite-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"

    def settings_for(self, test_path: Path) -> PluginSettings:
        config = self.config
        return resolve_settings(
            {dest: config.getoption(dest) for dest, _ in SETTINGS.values()},
            config.invocation_params.dir, test_path, config.inipath,
            {name: config.getini(name) for name in SETTINGS})

    def suite(self, path: Path) -> Suite:
        if path not in self.suites:
            self.suites[path] = load_suite(path)
        return self.suites[path]

    @property
    def from_runs(self) -> Optional[Path]:
        option = self.config.getoption("membench_from_runs")
        return (self.config.invocation_params.dir / option).resolve() if option else None

    def run_dir(self, selected: SelectedEntry) -> Path:
        if self.from_runs is not None:
            return self.from_runs / selected.name
        return selected.settings.results_dir / self.session_name / selected.name

    def run(self, selected: SelectedEntry) -> RunSummary:
        """The run of an entry for this session (launched on first use, then reused), or with
        --membench-from-runs the finished run of an earlier session."""
        from bench.run.execute import run_overrides

        run_dir = self.run_dir(selected)
        if run_dir not in self.summaries:
            if self.from_runs is not None:
                self.summaries[run_dir] = finished_run(selected.entry, run_dir)
            else:
                self.summaries[run_dir] = run_overrides(selected.entry.all_overrides(), run_dir,
                                                        f"{self.session_name}/{selected.name}")
        return self.summaries[run_dir]

    # registered as a plugin: collects the summary lines from every report (under xdist, from every worker)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for kind, line in report.user_properties:
            if kind == NOTE:
                self.notes.append(line)
            elif kind == UPDATE:
                self.updates.append(line)


def finished_run(entry: SuiteEntry, run_dir: Path) -> RunSummary:
    """An earlier session's run of `entry`, refused in one line when it is missing, unreadable or was made
    from another definition of the entry."""
    from bench.run.config import config_hash, with_setup_steps
    from bench.run.execute import compose_run_config

    if not (run_dir / "summary.json").is_file():
        pytest.fail(f"{entry.name}: no finished run at {run_dir} (--membench-from-runs takes a suite-<time> folder "
                    f"with one <entry>/summary.json per entry)", pytrace=False)
    try:
        summary = load_summary(run_dir)
    except ResultsError as err:
        pytest.fail(f"{entry.name}: {err}", pytrace=False)
    expected = config_hash(with_setup_steps(compose_run_config(entry.all_overrides())))  # as `run` resolves it
    if summary.config_hash != expected:
        pytest.fail(f"{entry.name}: the run at {run_dir} was made from another definition of this entry (config hash "
                    f"{summary.config_hash}, the suite's is {expected}); run the suite again without "
                    f"--membench-from-runs", pytrace=False)
    return summary


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("membench", "memory regression baselines")
    group.addoption("--membench-suite", default=None,
                    help="suite file (conf/suite/*.yaml) whose entries to check; default: the ini option "
                         "membench_suite")
    group.addoption("--baseline-dir", default=None,
                    help="where baselines live; default: membench_baseline_dir, else results/baselines next to "
                         "the ini file")
    group.addoption("--update-baselines", action="store_true", help="rewrite the baselines of the entries that ran")
    group.addoption("--membench-rtol", type=float, default=None,
                    help="relative tolerance for every metric, overriding the baselines' own")
    group.addoption("--membench-from-runs", default=None, metavar="DIR",
                    help="check (or with --update-baselines, promote) the finished runs of an earlier session "
                         "(its suite-<time> folder) instead of launching")
    group.addoption("--membench-results-dir", default=None,
                    help="where suite runs are written; default: membench_results_dir, else results/runs next to "
                         "the ini file")
    parser.addini("membench_suite", "membench suite file, relative to this ini file", default="")
    parser.addini("membench_baseline_dir", "membench baselines folder, relative to this ini file", default="")
    parser.addini("membench_results_dir", "folder for membench suite runs, relative to this ini file", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "membench: memory regression test against stored baselines")
    rtol = config.getoption("membench_rtol")
    if rtol is not None and rtol < 0:
        raise pytest.UsageError(f"--membench-rtol={rtol}: use a relative tolerance >= 0 (0.05 = 5%)")
    state = SessionState(config)
    suite_option = config.getoption("membench_suite")
    if suite_option:  # a suite named on the command line is checked before anything is collected
        try:
            state.suite((config.invocation_params.dir / suite_option).resolve())
        except SuiteError as err:
            raise pytest.UsageError(str(err)) from None
    config.stash[STATE_KEY] = state
    config.pluginmanager.register(state, "membench-session-state")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "membench_entry" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash[STATE_KEY]
    settings = state.settings_for(Path(metafunc.definition.path))
    if settings.suite_path is None:
        where = f" (config file: {settings.ini_path})" if settings.ini_path else " (no pytest config file found)"
        missing = MissingSuite(f"no membench suite configured{where}: {NO_SUITE_FIX}")
        metafunc.parametrize("membench_entry", [pytest.param(missing, id="no-suite", marks=pytest.mark.membench)])
        return
    try:
        suite = state.suite(settings.suite_path)
    except SuiteError as err:
        raise pytest.Collector.CollectError(f"{err} (suite from {settings.suite_source})") from None
    metafunc.parametrize("membench_entry", [
        pytest.param(SelectedEntry(entry, suite, settings), id=entry.name, marks=pytest.mark.membench)
        for entry in suite.entries])


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        if "membench_entry" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.membench)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> None:
    """A test standing in for a missing suite fails (in its call phase, whatever its body does)."""
    callspec = getattr(pyfuncitem, "callspec", None)
    missing = callspec.params.get("membench_entry") if callspec is not None else None
    if isinstance(missing, MissingSuite):
        pytest.fail(missing.message, pytrace=False)


@pytest.fixture
def membench_entries(request: pytest.FixtureRequest) -> Dict[str, SelectedEntry]:
    """The entries of the suite configured for the requesting test's file, by name (empty without a suite)."""
    state = request.config.stash[STATE_KEY]
    settings = state.settings_for(Path(request.path))
    if settings.suite_path is None:
        return {}
    suite = state.suite(settings.suite_path)
    return {entry.name: SelectedEntry(entry, suite, settings) for entry in suite.entries}


@pytest.fixture
def membench_run(request: pytest.FixtureRequest):
    """`membench_run(entry)` -> (summary, run directory) of an entry's run this session: the same run that
    `membench_check` compares, launched on first use and shared by every test of this process (under
    pytest-xdist, of the same worker: put such tests in the gate's file)."""
    state = request.config.stash[STATE_KEY]

    def run(selected: SelectedEntry):
        return state.run(selected), state.run_dir(selected)

    return run


@pytest.fixture
def membench_check(request: pytest.FixtureRequest):
    """Check an entry against its baseline, or rewrite the baseline under --update-baselines."""
    config = request.config
    state = config.stash[STATE_KEY]
    rtol_override = config.getoption("membench_rtol")

    def report(kind: str, line: str) -> None:
        request.node.user_properties.append((kind, line))

    def check(selected: SelectedEntry) -> None:
        if not isinstance(selected, SelectedEntry):
            raise TypeError("membench_check expects the `membench_entry` fixture's value")
        entry = selected.entry
        path = baseline_path(selected.settings.baseline_dir, entry)
        if config.getoption("update_baselines"):
            summary = state.run(selected)
            if summary.status not in ("ok", "oom"):
                pytest.fail(f"{entry.name}: run ended {summary.status} ({summary.error}); baseline not written",
                            pytrace=False)
            try:
                old = load_baseline(path, entry)
            except BaselineError:
                old = None
            new = make_baseline(entry, summary, rtol_override if rtol_override is not None else selected.suite.rtol)
            write_baseline(path, new)
            report(UPDATE, f"{describe_update(old, new)} -> {path}")
            return
        try:
            baseline = load_baseline(path, entry)  # before launching: a broken baseline fails fast
        except BaselineError as err:
            pytest.fail(str(err), pytrace=False)
        summary = state.run(selected)
        if summary.status != entry.expect and baseline["status"] == entry.expect:
            report(NOTE, f"{entry.name}: suite expects {entry.expect}, run ended {summary.status}")
        result = compare(entry, baseline, summary, rtol_override)
        for note in result.notes:
            report(NOTE, note)
        if not result.ok:
            pytest.fail(f"{format_comparison(result)}\nrun: {state.run_dir(selected)}", pytrace=False)
        if result.version_changes:
            report(NOTE, f"{entry.name}: passes, but the baseline was recorded under other versions: "
                         + "; ".join(result.version_changes))

    return check


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None or not (state.notes or state.updates):
        return
    terminalreporter.section("membench")
    for line in state.updates:
        terminalreporter.write_line(f"updated baseline: {line}")
    for line in state.notes:
        terminalreporter.write_line(f"note: {line}")
