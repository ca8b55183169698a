"""pytest plugin: memory regression tests against stored baselines (registered as `pytest11`).

Options: --membench-suite FILE, --baseline-dir DIR, --update-baselines, --membench-rtol X,
--membench-results-dir DIR. A test asks for the `membench_entry` fixture (parametrized over the
suite's entries, marked `membench`) and calls `membench_check(membench_entry)`:

    def test_memory(membench_entry, membench_check):
        membench_check(membench_entry)

Each entry runs once per session (its own torchrun); `pytest -m membench` runs exactly the suite.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from bench.baseline import (BaselineError, baseline_path, compare, describe_update, format_rows, load_baseline,
                            make_baseline, write_baseline)
from bench.suite import Suite, SuiteEntry, SuiteError, load_suite

SUITE_KEY = pytest.StashKey[Optional[Suite]]()
STATE_KEY = pytest.StashKey["SessionState"]()


class SessionState:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.summaries: Dict[str, object] = {}
        self.notes: List[str] = []
        self.updates: List[str] = []
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.results_dir = Path(config.getoption("membench_results_dir")) / f"suite-{stamp}"

    def run(self, entry: SuiteEntry):
        """The run of `entry` for this session (launched on first use, then reused)."""
        from bench.suite import run_overrides

        if entry.name not in self.summaries:
            run_dir = self.results_dir / entry.name
            self.summaries[entry.name] = run_overrides(entry.all_overrides(), run_dir,
                                                       f"{self.results_dir.name}/{entry.name}")
        return self.summaries[entry.name]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("membench", "memory regression baselines")
    group.addoption("--membench-suite", default=None, help="suite file (conf/suite/*.yaml) whose entries to check")
    group.addoption("--baseline-dir", default="results/baselines", help="where baselines live (default %(default)s)")
    group.addoption("--update-baselines", action="store_true", help="rewrite the baselines of the entries that ran")
    group.addoption("--membench-rtol", type=float, default=None,
                    help="relative tolerance for every metric, overriding the baselines' own")
    group.addoption("--membench-results-dir", default="results/runs", help="where suite runs are written")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "membench: memory regression test against stored baselines")
    suite_path = config.getoption("membench_suite")
    try:
        config.stash[SUITE_KEY] = load_suite(Path(suite_path)) if suite_path else None
    except SuiteError as err:
        raise pytest.UsageError(str(err)) from None
    rtol = config.getoption("membench_rtol")
    if rtol is not None and rtol < 0:
        raise pytest.UsageError(f"--membench-rtol={rtol}: use a relative tolerance >= 0 (0.05 = 5%)")
    config.stash[STATE_KEY] = SessionState(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "membench_entry" not in metafunc.fixturenames:
        return
    suite = metafunc.config.stash[SUITE_KEY]
    entries = suite.entries if suite else []
    metafunc.parametrize("membench_entry", [pytest.param(e, id=e.name, marks=pytest.mark.membench) for e in entries])


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        if "membench_entry" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.membench)


@pytest.fixture
def membench_run(request: pytest.FixtureRequest):
    """Run a suite entry (once per session) and return its RunSummary."""
    state = request.config.stash[STATE_KEY]
    return state.run


@pytest.fixture
def membench_check(request: pytest.FixtureRequest):
    """Check an entry against its baseline, or rewrite the baseline under --update-baselines."""
    config = request.config
    state = config.stash[STATE_KEY]
    suite = config.stash[SUITE_KEY]
    baseline_dir = Path(config.getoption("baseline_dir"))
    rtol_override = config.getoption("membench_rtol")

    def check(entry: SuiteEntry) -> None:
        path = baseline_path(baseline_dir, entry)
        if config.getoption("update_baselines"):
            summary = state.run(entry)
            if summary.status not in ("ok", "oom"):
                pytest.fail(f"{entry.name}: run ended {summary.status} ({summary.error}); baseline not written",
                            pytrace=False)
            try:
                old = load_baseline(path, entry)
            except BaselineError:
                old = None
            new = make_baseline(entry, summary, rtol_override if rtol_override is not None else suite.rtol)
            write_baseline(path, new)
            state.updates.append(f"{describe_update(old, new)} -> {path}")
            return
        try:
            baseline = load_baseline(path, entry)  # before launching: a broken baseline fails fast
        except BaselineError as err:
            pytest.fail(str(err), pytrace=False)
        summary = state.run(entry)
        if summary.status != entry.expect and baseline["status"] == entry.expect:
            state.notes.append(f"{entry.name}: suite expects {entry.expect}, run ended {summary.status}")
        result = compare(entry, baseline, summary, rtol_override)
        state.notes.extend(result.notes)
        if not result.ok:
            lines = list(result.reasons)
            if result.rows:
                lines.append(format_rows(result.rows))
            lines.append(f"run: {state.results_dir / entry.name}")
            pytest.fail("\n".join(lines), pytrace=False)

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
