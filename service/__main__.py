"""The `nalu-sweep` process (``python -m service`` is the same command).

It runs the Typer app and lets Python end the process as usual: the status is the one the
command exits with, and an uncaught exception exits 1. Nothing here ends the process early
(an ``os._exit`` that saved the interpreter's teardown once let a failed start exit 0), so a
Slurm job, a Ray job, a shell script or CI sees every failure.

A broken installation (a dependency missing or failing to import) is not a bug of the
command: it gets one clear line naming the module and how to repair the install, and exit
status 1, instead of a traceback.

The garbage collector runs less often while the command loads its libraries
(`service.startup`), and the process's last exit handler collects the garbage once (every
finalizer of an object already unreachable runs) and then freezes what is left
(`gc.freeze`). The interpreter's own finalization then does not scan the libraries' objects
again in each of its collections: a sweep's driver holds about 390,000 of them (Ray, Tune,
MLflow, SQLAlchemy, pandas), and that scanning was 0.9 s of every sweep's end. Module
teardown, the other exit handlers, the flushing of stdout and stderr, and the exit status
are as before.
"""

from __future__ import annotations

import atexit
import sys

from service.startup import collect_then_freeze, loading

#: the exit status of a command that could not start because its installation is broken
BROKEN_INSTALL = 1


def _load_app():
    """The Typer app, or a clear exit when the installation cannot provide it."""
    try:
        from service.cli import app
    except ImportError as e:  # ModuleNotFoundError included
        missing = getattr(e, "name", None) or "a module"
        print(f"nalu-sweep: cannot start: {e} (while importing {missing!s}).\n"
              "The installation is incomplete or broken: reinstall the package with its dependencies, "
              "e.g. `pip install -e .` in the checkout or `pip install nalu-sweep`.", file=sys.stderr)
        raise SystemExit(BROKEN_INSTALL) from None
    return app


def main() -> None:
    """The ``nalu-sweep`` command."""
    # registered before any library is imported, so that it runs after all of theirs
    # (exit handlers run last registered, first)
    atexit.register(collect_then_freeze)
    loading()  # until the command has loaded what it needs (`service.startup.loaded`)
    app = _load_app()
    app(prog_name="nalu-sweep")


if __name__ == "__main__":
    main()
