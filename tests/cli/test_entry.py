"""The `nalu-sweep` process ends without Python's teardown (`service.cli.entry`), and loses
nothing by it: exit codes, buffered output, atexit handlers and threads as Python's own exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.cli.entry import exit_code

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, str(path)], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("code", "status", "printed"), [(None, 0, ""), (0, 0, ""), (2, 2, ""), (256 + 3, 3, ""),
                                                         ("went wrong", 1, "went wrong\n")])
def test_exit_codes_are_pythons(code, status, printed, capsys):
    assert exit_code(SystemExit(code)) == status
    assert capsys.readouterr().err == printed


def test_the_command_ends_as_python_would_less_its_teardown(tmp_path):
    """The verb's output (buffered, into a pipe), an atexit handler registered before it and a
    non-daemon thread still running all come through; the exit code is the verb's."""
    done = tmp_path / "thread-done"
    result = _run(f"""
        import atexit, sys, threading, time
        from service.cli import entry

        atexit.register(lambda: print("atexit handler ran"))
        def late():
            time.sleep(0.5)
            open({str(done)!r}, "w").write("ok")
        threading.Thread(target=late).start()
        for i in range(20000):
            print(f"line {{i}}")
        sys.argv = ["nalu-sweep", "--help"]
        entry.main()
        print("after main")
        """, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:20000] == [f"line {i}" for i in range(20000)]
    assert "Usage: nalu-sweep" in result.stdout
    assert lines[-1] == "atexit handler ran"
    assert "after main" not in result.stdout  # the process ended in main
    assert done.read_text() == "ok"


def test_a_user_error_keeps_its_message_and_status(tmp_path):
    result = subprocess.run([sys.executable, "-m", "service", "best", "nosuch", "--tracking-uri",
                             f"sqlite:///{tmp_path / 'missing.db'}"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2
    assert result.stderr.startswith("error: no tracking store at")


def test_an_uncaught_exception_is_shown_and_exits_1(tmp_path):
    result = _run("""
        import service.cli
        from service.cli import entry

        def broken(**kwargs):
            raise RuntimeError("a bug, shown with its traceback")
        service.cli.app = broken
        entry.main()
        """, tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "RuntimeError: a bug, shown with its traceback" in result.stderr
