"""A non-editable install works: the wheel ships every file the package reads at run time
(the report's dashboard definition, the C sources of the native kernels), and nothing
finds files through the source checkout.

The wheel is built without build isolation (no download) and installed without its
dependencies into a fresh virtual environment that sees the running interpreter's
installed packages (torch, Ray, MLflow are large) through a path file: the running
interpreter may be a virtual environment itself, whose packages a new venv's
``--system-site-packages`` would not see (it reaches the base Python's). Only plain
folders are added, so the checkout's editable install (a finder set up by a path file of
its own) stays out; the test asserts that the package is the wheel's before running
``nalu-sweep run`` from it, outside the repository.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _site_folders() -> list[str]:
    """The folders the running interpreter imports installed packages from (a venv's, or the
    system's, and the user's where Python reads it)."""
    folders = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        folders.append(site.getusersitepackages())
    return [f for f in folders if os.path.isdir(f)]


def _new_venv(venv: Path, cwd: Path) -> Path:
    """A fresh venv that sees the running interpreter's installed packages; its python."""
    _run(sys.executable, "-m", "venv", str(venv), cwd=cwd)
    python = venv / "bin" / "python"
    own = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=cwd).stdout.strip()
    (Path(own) / "_running_interpreter.pth").write_text("".join(f"{f}\n" for f in _site_folders()))
    return python


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_the_wheel_installs_and_trains_outside_the_checkout(tmp_path):
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO),
         cwd=tmp_path)
    wheel = next(dist.glob("nalu_sweep-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "service/report/dashboard.yaml" in names
    shipped_c = [n for n in names if n.endswith(".c")]
    in_tree = sorted(str(p.relative_to(REPO)) for p in (REPO / "service").rglob("*.c"))
    assert sorted(shipped_c) == in_tree, "every C source of the package must be in the wheel"

    venv = tmp_path / "venv"
    python = _new_venv(venv, tmp_path)
    # --force-reinstall: the checkout's editable install (same name and version) is visible
    # through the running interpreter's site folders, and pip would otherwise call the wheel installed
    _run(str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel),
         cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["NALU_SWEEP_CACHE"] = str(tmp_path / "kernel-cache")  # a fresh build from the shipped sources
    where = _run(str(python), "-c", "import service; print(service.__file__)", cwd=tmp_path, env=env).stdout
    assert str(venv) in where, f"the installed package must be the wheel's, not the checkout: {where}"

    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    _run(str(venv / "bin" / "nalu-sweep"), "run", "--task", "small_mul", "--seeds", "2", "--steps", "20",
         "--eval-every", "10", "--quiet", "--output", "result.json", cwd=workdir, env=env)
    result = json.loads((workdir / "result.json").read_text())
    assert len(result["seeds"]) == 2

    # a dependency made unimportable: the installed command says so and fails, never exits 0
    shadow = tmp_path / "shadow" / "typer"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('typer made unimportable by the test')\n")
    broken = subprocess.run([str(venv / "bin" / "nalu-sweep"), "run", "--task", "small_mul", "--seeds", "2"],
                            cwd=workdir, env={**env, "PYTHONPATH": str(tmp_path / "shadow")},
                            capture_output=True, text=True, timeout=600)
    assert broken.returncode == 1, (broken.stdout, broken.stderr)
    assert "nalu-sweep: cannot start:" in broken.stderr and "typer" in broken.stderr
