"""The `nalu-sweep` process (``python -m service`` is the same command): run the app, then
end without tearing the interpreter down.

After a sweep, Python's own finalization — freeing every module of torch, Ray, MLflow,
Optuna and matplotlib object by object — took about 1.4 s of wall time on the 2-core
development machine, after the last line was printed and every result written (issue 14,
sweep overhead). `main` registers `_end` as the first `atexit` handler, so that it runs
last: Python still joins non-daemon threads and runs every handler registered during the
command (Ray's shutdown, logging's flush, MLflow's, temporary directories'), then `_end`
flushes stdout and stderr and ends the process with the command's exit status.

Only the real process goes through here; tests call `service.cli.app` in-process. This
module imports nothing of the project's or its libraries' before registering `_end`; a
handler registered earlier still (by a site hook at interpreter start) would not run,
except logging's, which `_end` calls itself.
"""

from __future__ import annotations

import atexit
import os
import sys

_status = [0]  # the exit status `_end` gives the process; set by `main`


def exit_status(exit: SystemExit) -> int:
    """The status Python gives ``sys.exit(code)``: None is 0, an int is itself (mod 256),
    anything else (printed to stderr by Python) is 1."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code & 0xFF
    return 1


def _end() -> None:
    if "logging" in sys.modules:  # its own handler may have been registered before this one
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed or missing stream: nothing to keep
            pass
    os._exit(_status[0])


def main() -> None:
    """The ``nalu-sweep`` command."""
    atexit.register(_end)
    from service.cli import app

    try:
        app(prog_name="nalu-sweep")
    except SystemExit as e:
        _status[0] = exit_status(e)
        raise
    except KeyboardInterrupt:
        _status[0] = 130
        raise
    except BaseException:
        _status[0] = 1
        raise


if __name__ == "__main__":
    main()
