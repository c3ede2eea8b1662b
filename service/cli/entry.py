"""The `nalu-sweep` process: run the app, then leave without tearing the interpreter down.

After a sweep, Python's own finalization (freeing every module of torch, Ray, MLflow,
Optuna, matplotlib one object at a time) took about 1.4 s of wall time on the 2-core
development machine, after the last line was printed and every result written (issue 14,
sweep overhead). `main` does what finalization does that matters — waits for non-daemon
threads, runs the `atexit` handlers (Ray's shutdown, logging's flush, MLflow's, temporary
directories'), flushes stdout and stderr — then ends the process with its exit code.

Only the real process goes through here (the console script and ``python -m service``);
tests call `service.cli.app` in-process and are untouched.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_code(exit: SystemExit) -> int:
    """The status Python itself would give ``sys.exit(code)``: None is 0, an int is itself,
    anything else is printed to stderr and is 1."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code & 0xFF
    print(exit.code, file=sys.stderr)
    return 1


def leave(code: int) -> NoReturn:
    """End the process as Python would, less the freeing of memory the OS reclaims anyway."""
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # noqa: SLF001 - what Py_Finalize runs; there is no public name
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed or missing stream: nothing to keep
            pass
    os._exit(code)


def main() -> NoReturn:
    """The ``nalu-sweep`` command."""
    from service.cli import app

    try:
        app(prog_name="nalu-sweep")
        code = 0
    except SystemExit as e:
        code = exit_code(e)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - shown as Python shows an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    leave(code)
