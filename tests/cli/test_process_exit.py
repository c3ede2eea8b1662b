"""The `nalu-sweep` process ends without Python's teardown (`service.__main__`), and loses
nothing by it: exit statuses, buffered output, atexit handlers, threads and thread pools,
an uncaught exception's traceback, as Python's own exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.__main__ import exit_status

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``script`` replaces the app with ``command`` and runs the real `main` in a fresh process."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (2, 2), (256 + 3, 3), ("went wrong", 1)])
def test_exit_statuses_are_pythons(code, status):
    assert exit_status(SystemExit(code)) == status


def test_the_command_ends_as_python_would_less_its_teardown(tmp_path):
    """What the command printed (buffered, into a pipe), an atexit handler it registered, a
    non-daemon thread and a thread pool it left running all come through; the status is its own."""
    done = tmp_path / "thread-done"
    result = _run(f"""
        import atexit, sys, threading, time, logging
        from concurrent.futures import ThreadPoolExecutor
        import service.__main__ as entry
        import service.cli

        def command(**kwargs):
            atexit.register(lambda: print("atexit handler ran"))
            logging.basicConfig(filename={str(tmp_path / 'log.txt')!r}, level=logging.INFO)
            logging.getLogger("cmd").info("logged")
            def late():
                time.sleep(0.5)
                open({str(done)!r}, "w").write("ok")
            threading.Thread(target=late).start()
            ThreadPoolExecutor(max_workers=1).submit(time.sleep, 0.1)  # never shut down
            for i in range(20000):
                print(f"line {{i}}")
            sys.exit(3)

        class TornDown:  # Python's teardown would call this; the fast end does not
            def __del__(self):
                sys.stderr.write("torn down\\n")

        kept = TornDown()
        service.cli.app = command
        entry.main()
        """, tmp_path)
    assert result.returncode == 3, result.stderr
    assert "torn down" not in result.stderr  # the interpreter was not torn down
    lines = result.stdout.splitlines()
    assert lines == [f"line {i}" for i in range(20000)] + ["atexit handler ran"]
    assert done.read_text() == "ok"
    assert "logged" in (tmp_path / "log.txt").read_text()


def test_the_real_command_keeps_its_output_and_status(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run([sys.executable, "-m", "service", "--help"], cwd=tmp_path, capture_output=True, text=True,
                        timeout=120, env=env)
    assert ok.returncode == 0 and "Usage: nalu-sweep" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "service", "best", "nosuch", "--tracking-uri",
                          f"sqlite:///{tmp_path / 'missing.db'}"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: no tracking store at")


@pytest.mark.parametrize(("raised", "status", "shown"), [
    ('RuntimeError("a bug, shown with its traceback")', 1, "RuntimeError: a bug, shown with its traceback"),
    ('SystemExit("a message instead of a status")', 1, "a message instead of a status"),
    ("KeyboardInterrupt()", 130, "KeyboardInterrupt"),
])
def test_what_escapes_the_command_is_shown_as_python_shows_it(tmp_path, raised, status, shown):
    result = _run(f"""
        import service.__main__ as entry
        import service.cli

        def command(**kwargs):
            raise {raised}

        service.cli.app = command
        entry.main()
        """, tmp_path)
    assert result.returncode == status
    assert shown in result.stderr
