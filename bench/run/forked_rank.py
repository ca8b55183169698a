"""One rank forked from its torchrun agent (bench.run.agent --fork-ranks), supervised by the process torchrun
forked for it.

torchrun's function entrypoint reports one failure per failed attempt: when rank 1 is killed and rank 0
fails an instant later on the broken connection, the agent may name only rank 0 (exit 1), and which rank
was killed, by what, is lost. So the process torchrun forks for a rank forks the rank once more and waits
for it: it passes on the signals that end a run (SIGTERM, SIGINT, SIGHUP, SIGQUIT), prints how the rank
ended when it failed (`[membench] rank R exitcode C (pid P)`, which bench.run.launch reads as it reads
torchrun's own failure summary) and ends the same way, so the agent sees the rank's own exit code or
signal. The rank is `bench.run.worker.main` in a process of its own, ended with os._exit (no teardown of
the forked interpreter, never a return into torchrun's wrapper, which waits for its parent to collect a
return value).
"""
from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import NoReturn

from bench.results.schema import EXIT_FAILED, EXIT_OK

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
EXIT_LINE = "[membench] rank {rank} exitcode {code} (pid {pid})"  # bench.run.launch parses it


def _run_rank(argv) -> NoReturn:
    from bench.run import worker

    code = EXIT_FAILED
    try:
        code = worker.main(list(argv))  # ends the process itself on every path but an exception
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_FAILED
    except BaseException:  # noqa: BLE001 (torchelastic's @record already wrote the error file)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _end_like(status: int) -> NoReturn:
    """End this process as the rank ended: the same signal, or the same exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


def forked_rank(*argv: str) -> int:
    """torchrun's entrypoint for one rank: fork the rank, pass it the run-ending signals, wait, report."""
    pid = os.fork()
    if pid == 0:
        for sig in FORWARDED_SIGNALS:  # as in a fresh interpreter: the agent's handlers are not the rank's
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        _run_rank(argv)
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == EXIT_OK:
        return EXIT_OK  # torchrun counts the rank done once its entrypoint returns
    print(EXIT_LINE.format(rank=os.environ.get("RANK", "?"), code=code, pid=pid), flush=True)
    _end_like(status)
