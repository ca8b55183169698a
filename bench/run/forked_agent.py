"""torchrun's agent forked from the launching process itself (launcher.fork_agent, with forked ranks off CUDA).

`python -m bench.run.agent --fork-ranks ...` pays the imports of a rank once per run (torch, torchrec,
fbgemm, dynamo: 3-4 s of CPU here), while the process that launches it has made most of them already for
the run's prediction: a sweep, the regression gate and the test suite launch many runs from one process
and paid them again for each. So that process imports what a rank imports (once) and forks the agent,
which becomes what `python -m bench.run.agent ARGS` would be: its own session, the run's environment,
stdin from /dev/null, stdout and stderr into one pipe, the signal handlers of a fresh interpreter, the same
command line (set as the process title, so bench.run.reaper finds its ranks as before), the same exit
status, and an end without the interpreter's teardown. Never on CUDA (bench.run.agent: a forked child
cannot use a CUDA context), and only when this process's OpenMP threads could be ended first
(release_openmp_threads). `launcher.fork_agent=false` starts it as a command instead.
"""
from __future__ import annotations

import ctypes
import faulthandler
import io
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, List, Optional

from bench.results.schema import EXIT_FAILED, EXIT_OK

# the handlers a fresh interpreter starts with, for the signals a launching process may have taken over
_FRESH_HANDLERS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
                   signal.SIGHUP: signal.SIG_DFL, signal.SIGQUIT: signal.SIG_DFL, signal.SIGCHLD: signal.SIG_DFL,
                   signal.SIGUSR1: signal.SIG_DFL, signal.SIGUSR2: signal.SIG_DFL, signal.SIGALRM: signal.SIG_DFL}
OMP_PAUSE_HARD = 2  # omp_pause_resource_t: end the threads of OpenMP's pool (OpenMP 5.0)


def release_openmp_threads() -> bool:
    """End GNU OpenMP's thread pool in this process, if it has one; False when it cannot be.

    After a fork libgomp's child believes in its parent's pool threads, which do not exist there: the first
    parallel region of a rank (torch's intra-op kernels) then waits for them forever. A process that ran
    a parallel torch op has such a pool (the test suite does; `membench run` predicts on `meta`, which has
    none). Ended before the fork, the pool is made anew on either side of it when next needed."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return False  # not Linux: no way to tell, so never fork
    libraries = {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line.split()[-1]}
    for library in libraries:
        try:
            pause_all = ctypes.CDLL(library).omp_pause_resource_all
        except (OSError, AttributeError):
            return False  # a libgomp older than OpenMP 5.0 (GCC 9)
        pause_all.argtypes, pause_all.restype = [ctypes.c_int], ctypes.c_int
        if pause_all(OMP_PAUSE_HARD) != 0:
            return False
    return True


class ForkedAgent:
    """What bench.run.launch and bench.run.reaper use of a subprocess.Popen, for a forked agent: `pid`,
    `stdout` (its output, text, line by line), `poll()`, `wait()` and `returncode` (negative: the signal)."""

    def __init__(self, pid: int, stdout: io.TextIOBase):
        self.pid, self.stdout = pid, stdout
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # collected elsewhere: its status is lost
                self.returncode = EXIT_FAILED
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"agent {self.pid} still running after {timeout} s")
            time.sleep(0.02)
        return self.returncode


def start_forked_agent(command: List[str], env: dict,
                       agent_main: Optional[Callable[[List[str]], None]] = None) -> Optional[ForkedAgent]:
    """Fork `command` (`python -m bench.run.agent --fork-ranks ARGS`) from this process as its agent, which
    runs `agent_main(ARGS)` (bench.run.agent.main); None, with nothing started, where this process's OpenMP
    threads cannot be ended (release_openmp_threads): the caller starts the command instead."""
    from bench.run import agent

    agent_args = command[command.index(agent.FORK_RANKS_FLAG) + 1:]
    agent.preload_rank_imports(agent.worker_args(agent_args))  # here, once: every later run's agent has them
    if not release_openmp_threads():  # after the imports: nothing may start a pool between this and the fork
        return None
    read_fd, write_fd = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else the child would write this process's pending output once more
    pid = os.fork()
    if pid == 0:  # the agent: never returns into the launcher's stack
        os.close(read_fd)
        _run_agent(command, agent_args, env, write_fd, agent_main or agent.main)
    os.close(write_fd)
    return ForkedAgent(pid, io.open(read_fd, "r", encoding="utf-8", errors="replace"))


def _run_agent(command: List[str], agent_args: List[str], env: dict, output_fd: int,
               agent_main: Callable[[List[str]], None]) -> None:
    code = EXIT_FAILED
    try:
        _become_fresh_agent(command, env, output_fd)
        agent_main(agent_args)
        code = EXIT_OK
    except SystemExit as exc:
        code = _exit_status(exc.code)
    except KeyboardInterrupt:  # as a fresh interpreter ends on an unhandled Ctrl-C: by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _flush()
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 (printed as the interpreter would, then exit 1)
        traceback.print_exc()
    finally:
        _flush()
        os._exit(code)


def _become_fresh_agent(command: List[str], env: dict, output_fd: int) -> None:
    """This forked child, made what `subprocess.Popen(command, env=env, stdout=PIPE, stderr=STDOUT,
    start_new_session=True)` would have started."""
    import setproctitle

    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    os.close(null)
    os.close(output_fd)
    old_outputs = {id(sys.stdout), id(sys.__stdout__)}
    old_errors = {id(sys.stderr), id(sys.__stderr__)}
    # new stream objects: the old ones may be a test runner's captures, or locked by a thread left behind
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True,
                                                   errors="backslashreplace")
    # the root logger as a fresh interpreter has it: no handler, WARNING (a launcher's, Hydra's for one, showed
    # every library's INFO lines in the run's output, and wrote them into its own log file)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    for handler in _stream_handlers():  # the libraries' own handlers made before the fork hold the old ones
        if id(handler.stream) in old_errors:
            handler.setStream(sys.stderr)
        elif id(handler.stream) in old_outputs:
            handler.setStream(sys.stdout)
    if faulthandler.is_enabled():
        faulthandler.disable()  # it wrote to the launcher's stderr; a fresh interpreter has it off
    for signum, handler in _FRESH_HANDLERS.items():
        signal.signal(signum, handler)
    # what bench.run.reaper reads as its command line: set before the environment changes (setproctitle
    # finds the room for a title through the original environment strings)
    setproctitle.setproctitle(" ".join(command))
    os.environ.clear()
    os.environ.update(env)
    # a fresh interpreter's OpenMP reads its thread count from the environment as it starts
    if env.get("OMP_NUM_THREADS", "").isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    from bench.run import agent

    sys.argv = [agent.__file__, *command[3:]]  # as `python -m bench.run.agent ARGS` sees them


def _stream_handlers() -> List[logging.StreamHandler]:
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    return [handler for logger in loggers for handler in logger.handlers
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)]


def _exit_status(code) -> int:
    """The exit status an interpreter gives `sys.exit(code)`."""
    if code is None:
        return EXIT_OK
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return EXIT_FAILED


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
