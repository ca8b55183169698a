"""The house rules on the code's shape, read from the source (AST only: nothing of the project is imported):
no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES, and `workloads/` (the pure
description of a workload) never imports `bench`."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60  # from the `def` line to the function's last line (decorators not counted)
MODULE_DIRS = ("bench", "workloads", "tests")
FUNCTION_DIRS = ("bench", "workloads")


def _modules(*dirs: str) -> Iterator[Path]:
    for top in dirs:
        yield from sorted((REPO_ROOT / top).rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def long_modules(limit: int = MAX_MODULE_LINES) -> List[Tuple[str, int]]:
    """(path, lines) of each module over `limit` lines."""
    lengths = ((_relative(path), len(path.read_text(encoding="utf-8").splitlines()))
               for path in _modules(*MODULE_DIRS))
    return [(path, lines) for path, lines in lengths if lines > limit]


def long_functions(limit: int = MAX_FUNCTION_LINES) -> List[Tuple[str, int]]:
    """("path:line name", lines) of each function or method over `limit` lines, nested ones too."""
    found = []
    for path in _modules(*FUNCTION_DIRS):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((f"{_relative(path)}:{node.lineno} {node.name}", lines))
    return found


def imports_of(tree: ast.AST) -> Iterator[Tuple[int, str]]:
    """(line, module) of every absolute import in `tree`, local ones inside functions too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def bench_imports_in_workloads() -> List[str]:
    """"path:line module" of each import of `bench` (or below it) by a module under workloads/."""
    return [f"{_relative(path)}:{line} {module}"
            for path in _modules("workloads")
            for line, module in imports_of(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
            if is_bench(module)]


def is_bench(module: str) -> bool:
    return module == "bench" or module.startswith("bench.")


def _listing(offenders: List[Tuple[str, int]]) -> str:
    return "\n".join(f"  {where}: {lines} lines" for where, lines in offenders)


def test_no_module_is_over_the_line_limit():
    offenders = long_modules()
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines (split them):\n{_listing(offenders)}"


def test_no_function_is_over_the_line_limit():
    offenders = long_functions()
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n{_listing(offenders)}"


def test_workloads_never_import_bench():
    offenders = bench_imports_in_workloads()
    assert not offenders, "workloads/ imports bench (workloads describe; bench measures):\n  " + "\n  ".join(offenders)


def test_the_import_scan_sees_every_form_of_import():
    tree = ast.parse("import bench\nimport os, bench.run as r\nfrom bench.planning import x\n"
                     "def f():\n    from bench import y\nfrom . import z\nfrom benchmarks import w\n")
    modules = [module for _, module in imports_of(tree)]
    assert sorted(modules) == ["bench", "bench", "bench.planning", "bench.run", "benchmarks", "os"]
    assert sum(is_bench(module) for module in modules) == 4  # not benchmarks
