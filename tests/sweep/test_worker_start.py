"""What a sweep's Ray worker changes as it starts: Ray Tune's trainables import IPython only
where it is loaded already. Checked in a fresh interpreter with a stand-in IPython package
that records its import and its shell-clearing call, so the check runs where IPython is not
installed too."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

from ray.tune.trainable import Trainable

STAND_IN = '''
import os
open(os.environ["IPYTHON_LOG"], "a").write("imported\\n")


def get_ipython():  # no shell runs (Ray asks where IPython is loaded)
    return None
'''
SHELL = '''
import os
class InteractiveShell:
    @classmethod
    def clear_instance(cls):
        open(os.environ["IPYTHON_LOG"], "a").write("cleared\\n")
'''


def _run(tmp_path, body: str) -> list[str]:
    package = tmp_path / "site" / "IPython"
    (package / "core").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(STAND_IN)
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "interactiveshell.py").write_text(SHELL)
    log = tmp_path / "ipython.log"
    log.unlink(missing_ok=True)
    script = textwrap.dedent(body)
    env = {"PYTHONPATH": str(tmp_path / "site"), "IPYTHON_LOG": str(log), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)
    return log.read_text().split() if log.exists() else []


def test_tunes_trainable_calls_the_function_that_is_replaced():
    from ray.tune.trainable import trainable

    assert "disable_ipython()" in inspect.getsource(Trainable.__init__)
    assert callable(trainable.disable_ipython)


def test_a_worker_without_ipython_loaded_does_not_import_it(tmp_path):
    call = """
        from ray.tune.trainable import trainable
        {patch}
        trainable.disable_ipython()  # as Trainable.__init__ calls it
    """
    assert _run(tmp_path, call.format(patch="")) == ["imported", "cleared"]  # Tune's own behaviour
    patch = "from service.sweep.worker_start import ipython_only_where_loaded; ipython_only_where_loaded()"
    assert _run(tmp_path, call.format(patch=patch)) == []


def test_a_worker_with_ipython_loaded_still_clears_its_shell(tmp_path):
    assert _run(tmp_path, """
        import IPython
        from ray.tune.trainable import trainable
        from service.sweep.worker_start import ipython_only_where_loaded
        ipython_only_where_loaded()
        ipython_only_where_loaded()  # twice: wrapped once
        trainable.disable_ipython()
    """) == ["imported", "cleared"]
