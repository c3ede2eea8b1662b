"""The `nalu-sweep` process (`service.__main__`) ends as Python ends it: exit statuses,
buffered output, atexit handlers, threads and thread pools, an uncaught exception's
traceback; a broken installation exits 1 with one clear line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``script`` replaces the app with ``command`` and runs the real `main` in a fresh process."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=env)


def test_the_command_ends_as_python_would(tmp_path):
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

        service.cli.app = command
        entry.main()
        """, tmp_path)
    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [f"line {i}" for i in range(20000)] + ["atexit handler ran"]
    assert done.read_text() == "ok"
    assert "logged" in (tmp_path / "log.txt").read_text()


@pytest.mark.parametrize("broken", ["missing", "failing"])
def test_a_broken_installation_exits_non_zero_with_one_clear_line(tmp_path, broken):
    """A dependency of the command that cannot be imported (absent, or raising ImportError on
    import) stops the command with status 1 and a line that says what to do, not a traceback."""
    shadow = tmp_path / "shadow" / "typer"
    shadow.mkdir(parents=True)
    if broken == "missing":  # a namespace-less package whose import fails as a missing module does
        (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'typer'\", name='typer')\n")
    else:
        (shadow / "__init__.py").write_text("raise ImportError('a broken build of typer')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(REPO)])}
    result = subprocess.run([sys.executable, "-m", "service", "--help"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("nalu-sweep: cannot start:"), result.stderr
    assert "typer" in result.stderr and "Traceback" not in result.stderr
    assert "reinstall" in result.stderr


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
    ("KeyboardInterrupt()", -signal.SIGINT, "KeyboardInterrupt"),  # a shell shows 130
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


def test_the_heap_is_collected_once_then_frozen_before_the_interpreter_finalizes(tmp_path):
    """The last exit handler runs every finalizer of the garbage left (an object in a
    reference cycle here), then freezes the heap: the interpreter's own final collections
    find it frozen (they scanned a sweep driver's ~390,000 objects several times: 0.9 s)."""
    result = _run("""
        import atexit, gc, os, sys
        import service.__main__ as entry
        import service.cli

        class Cycle:
            def __del__(self):
                os.write(1, b"finalized\\n")

        def command(**kwargs):
            gc.disable()  # no automatic collection before the exit: the command's handler
            atexit.register(gc.enable)  # enables it again, first of all exit handlers
            c = Cycle()
            c.self = c
            del c  # garbage from here on, in a cycle: only a collection finalizes it
            def watch(phase, info):
                if phase == "start" and sys.is_finalizing():
                    os.write(1, f"final collection, heap frozen: {gc.get_freeze_count() > 0}\\n".encode())
            gc.callbacks.append(watch)

        service.cli.app = command
        entry.main()
        """, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "finalized"
    assert lines[1:] and set(lines[1:]) == {"final collection, heap frozen: True"}


def test_loading_raises_the_collectors_threshold_and_loaded_freezes_once(tmp_path):
    """While a process loads its libraries the collector runs a hundred times less often;
    once loaded, the thresholds are back and what was loaded is frozen, the first time only
    (a second trial in one worker must not freeze the first one's garbage)."""
    result = _run("""
        import gc
        from service import startup

        default = gc.get_threshold()
        startup.loading()
        print(gc.get_threshold()[0] == startup.LOADING_THRESHOLD, gc.get_threshold()[1:] == default[1:])
        startup.loaded()
        first = gc.get_freeze_count()
        print(gc.get_threshold() == default, first > 0)
        later = [[] for _ in range(10)]  # tracked objects a second freeze would take
        startup.loading()
        startup.loaded()
        print(gc.get_threshold() == default, gc.get_freeze_count() == first)
        """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"] * 6
