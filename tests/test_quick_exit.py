"""Processes that imported torch end without the interpreter's final garbage collection
(bench.run.quick_exit), and torchrun's agent as membench starts it (bench.run.agent) is torchrun."""
from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT


def test_the_heap_is_frozen_at_exit_after_every_later_exit_handler(tmp_path):
    marker = tmp_path / "ran"
    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
            "from bench.run.quick_exit import skip_final_collection\n"
            "skip_final_collection()\n"
            f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
            "print('frozen before exit:', gc.get_freeze_count() > 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["frozen before exit: False", "frozen at exit: True"]
    assert marker.read_text() == "ran"  # a handler registered later still ran, before the freeze


def test_the_agent_module_is_torchrun_with_its_arguments_and_exit_status():
    from bench.run.launch import AGENT_MODULE, torchrun_commands

    proc = subprocess.run([sys.executable, "-m", AGENT_MODULE, "--help"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "--nproc-per-node" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", AGENT_MODULE, "--nproc-per-node=1"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "the following arguments are required: training_script" in proc.stderr
    assert torchrun_commands.__module__ == "bench.run.launch" and AGENT_MODULE == "bench.run.agent"
