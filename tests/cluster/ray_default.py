"""A Python that has Ray's full install (``ray[default]``: the dashboard and every node's
metrics agent, which exports metrics to Prometheus) beside this environment's packages.

The test environment keeps Ray minimal, so that every other test's `ray.init` starts no
dashboard or agent; the cluster tests that need them use a small virtual environment of
their own, made once (cached under ``$NALU_SWEEP_TEST_CACHE``, default
``~/.cache/nalu-sweep``): it sees this environment's packages through a ``.pth`` file and
adds only what ``ray[default]`` needs on top, at the installed Ray's exact version.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path


def _cache() -> Path:
    return Path(os.environ.get("NALU_SWEEP_TEST_CACHE", Path.home() / ".cache" / "nalu-sweep"))


def _has_agent(python: Path) -> bool:
    probe = "import ray, opencensus, prometheus_client, aiohttp_cors, grpc, ray.dashboard.agent"
    return subprocess.run([str(python), "-c", probe], capture_output=True, timeout=120).returncode == 0


def ray_default_python() -> tuple[Path | None, str]:
    """(python, "") or (None, why it could not be made)."""
    import ray

    venv = _cache() / f"ray-default-{ray.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
    python = venv / "bin" / "python"
    if python.exists() and _has_agent(python):
        return python, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True,
                       timeout=300)
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        Path(purelib, "nalu-sweep-base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               f"ray[default]=={ray.__version__}"], capture_output=True, text=True, timeout=600)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"could not make a virtual environment with ray[default]: {e}"
    if proc.returncode != 0:
        return None, f"pip could not install ray[default]=={ray.__version__}: {proc.stderr.strip()[-500:]}"
    if not _has_agent(python):
        return None, "ray[default] installed but its metrics agent does not import"
    return python, ""
