"""Where the pytest plugin finds its suite, baselines and results folder, whatever pytest's rootdir is.

pytest reads a path written after a space (`--baseline-dir /some/dir`) as a test path while it looks for
its ini file, before plugins have declared their options; the ini file then belongs to that folder (or is
not found at all) and every setting in the project's own ini file is silently dropped. So the plugin does
not trust pytest's choice alone: it reads its settings from the config file that governs the *test file*
asking for `membench_entry` (nearest pytest config file above it, the way pytest itself looks), and
resolves relative paths against that file's folder.

Precedence, per setting: the command line (`--membench-suite`, `--baseline-dir`, `--membench-results-dir`;
relative to the folder pytest was started in) > the ini option (`membench_suite`, `membench_baseline_dir`,
`membench_results_dir`; relative to the ini file) > the default (baselines in `results/baselines`, runs in
`results/runs`, next to the ini file; no default suite).
"""
from __future__ import annotations

import configparser
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

# ini option name -> (command-line dest, default relative to the ini file's folder)
SETTINGS = {
    "membench_suite": ("membench_suite", None),
    "membench_baseline_dir": ("baseline_dir", "results/baselines"),
    "membench_results_dir": ("membench_results_dir", "results/runs"),
}
NO_SUITE_FIX = ("set `membench_suite = conf/suite/<name>.yaml` under [tool.pytest.ini_options] in pyproject.toml "
                "(or [pytest] in pytest.ini), or pass --membench-suite=FILE")


@dataclass(frozen=True)
class PluginSettings:
    suite_path: Optional[Path]
    baseline_dir: Path
    results_dir: Path
    # where the suite setting came from, for messages ("--membench-suite", "membench_suite in <ini>")
    suite_source: str
    ini_path: Optional[Path]


def _read_ini_section(path: Path, section: str) -> Optional[Dict[str, str]]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return None
    return dict(parser.items(section)) if parser.has_section(section) else None


def _read_pyproject(path: Path) -> Optional[Dict[str, str]]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
        return None
    pytest_table = data.get("tool", {}).get("pytest")
    if not isinstance(pytest_table, dict):
        return None
    values = pytest_table.get("ini_options", pytest_table)  # pytest 9 also reads a native [tool.pytest]
    return {str(k): v for k, v in values.items() if isinstance(v, str)} if isinstance(values, dict) else None


# pytest's own order of config files within one folder
CONFIG_READERS = (
    ("pytest.ini", lambda p: _read_ini_section(p, "pytest") or {}),  # pytest.ini counts even when empty
    (".pytest.ini", lambda p: _read_ini_section(p, "pytest") or {}),
    ("pyproject.toml", _read_pyproject),
    ("tox.ini", lambda p: _read_ini_section(p, "pytest")),
    ("setup.cfg", lambda p: _read_ini_section(p, "tool:pytest")),
)


def governing_ini(start: Path) -> Tuple[Optional[Path], Dict[str, str]]:
    """The pytest config file pytest would use for a run started at `start`, and its values."""
    start = Path(start).resolve()
    first_pyproject = None
    for folder in (start, *start.parents) if start.is_dir() else start.parents:
        for name, reader in CONFIG_READERS:
            candidate = folder / name
            if candidate.is_file():
                values = reader(candidate)
                if values is not None:
                    return candidate, values
                if name == "pyproject.toml" and first_pyproject is None:
                    first_pyproject = candidate
    # like pytest: with no pytest section anywhere, the nearest pyproject.toml still marks the project root
    return first_pyproject, {}


def resolve_settings(cli_values: Dict[str, Optional[str]], invocation_dir: Path, test_path: Path,
                     pytest_ini: Optional[Path] = None,
                     pytest_ini_values: Optional[Dict[str, str]] = None) -> PluginSettings:
    """Settings for the membench tests in `test_path`.

    `cli_values` maps the command-line dests of SETTINGS to their values (None when not given);
    `pytest_ini` / `pytest_ini_values` are what pytest itself read (used when it is the same file, so that
    `-o membench_suite=...` overrides work)."""
    ini_path, ini_values = governing_ini(test_path)
    if pytest_ini is None or (ini_path is not None and ini_path == Path(pytest_ini).resolve()):
        # the same file pytest read (or none at all): its values include `-o name=value` overrides
        ini_values = {**ini_values, **{k: v for k, v in (pytest_ini_values or {}).items() if v}}
    base = ini_path.parent if ini_path is not None else Path(invocation_dir)
    resolved: Dict[str, Optional[Path]] = {}
    sources: Dict[str, str] = {}
    for ini_name, (dest, default) in SETTINGS.items():
        cli = cli_values.get(dest)
        if cli:
            resolved[ini_name] = (Path(invocation_dir) / cli).resolve()
            sources[ini_name] = f"--{dest.replace('_', '-')}"
        elif ini_values.get(ini_name):
            resolved[ini_name] = (base / ini_values[ini_name]).resolve()
            sources[ini_name] = f"{ini_name} in {ini_path}"
        else:
            resolved[ini_name] = (base / default).resolve() if default else None
            sources[ini_name] = "default"
    return PluginSettings(suite_path=resolved["membench_suite"], baseline_dir=resolved["membench_baseline_dir"],
                          results_dir=resolved["membench_results_dir"], suite_source=sources["membench_suite"],
                          ini_path=ini_path)
