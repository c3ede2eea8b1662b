"""Prepare the Python packages that the lent GPU machine lacks, packed to travel in one call.

The lent GPU machines (Python 3.12, torch with CUDA) have no pydantic, Ray, Optuna, MLflow or
plotly, reach no package registry, and a call carries at most 64 MiB. This script, run on a
machine with the project's environment installed (the versions it resolves are the ones
carried), does in one go:

  1. the dependency closure of pyproject.toml's [project] dependencies, read from the installed
     distributions' metadata (markers evaluated for the target Python on Linux x86-64), minus
     what the GPU machine already has (benchmarks/gpu_device_packages.txt), plus ALWAYS_CARRY;
  2. `pip download --no-deps --only-binary=:all:` of each, pinned to the installed version,
     for cpXY manylinux x86-64;
  3. `pip install --no-deps --target SITE` of those wheels;
  4. removes what a sweep never reads (TRIM: Ray's jars, RLlib, LLM, the dashboard's web
     client, MLflow's web UI, test suites...) and strips Ray's binaries' symbol tables;
  5. packs SITE as OUT/site.tar.xz.

On the GPU machine (the folder OUT carried, e.g. `.whl`):
    mkdir -p /tmp/site && tar -xJf .whl/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD

Usage:
    python benchmarks/gpu_wheels.py [--python 3.12] [--out .whl] [--build build/gpu_wheels]
                                    [--no-pack]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
DEVICE_LIST = Path(__file__).with_name("gpu_device_packages.txt")
# Carried although the GPU machine has them: the generated protobuf code of Ray and
# OpenTelemetry refuses an older protobuf runtime, and pydantic needs a recent
# typing-extensions; the versions installed here are the ones tested together.
ALWAYS_CARRY = ("protobuf", "typing-extensions")
# Never carried: the GPU machine's own torch is the one measured.
NEVER_CARRY = ("torch",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux_2_26_x86_64", "manylinux_2_5_x86_64", "linux_x86_64")
# Paths under SITE that a sweep, a Tune run, ray.init and the dashboard-less head never read:
# Ray's Java jars (33 MB), RLlib, Ray LLM and the dashboard's web client; MLflow's web UI;
# plotly's Jupyter extensions, widget bundle and sample data sets. (Ray's data and serve stay: its
# dashboard agent's modules import them.)
TRIM = (
    "ray/jars", "ray/rllib", "ray/llm", "ray/cpp", "ray/dashboard/client/build",
    "mlflow/server/js", "share/jupyter", "plotly/labextension", "plotly/package_data/datasets",
    "plotly/package_data/widgetbundle.js",
)
# Compiled programs whose symbol tables go (`strip --strip-unneeded`, as for every extension
# module `*.so`; the dynamic symbols that loading needs stay): a third of Ray's 120 MB of
# binaries, nine tenths of SQLAlchemy's Cython modules.
STRIP = ("ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")
TRIM_NAMES = ("__pycache__", "tests")


def device_packages() -> set[str]:
    names = set()
    for line in DEVICE_LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonicalize_name(line))
    return names


def marker_env(python: str) -> dict[str, str]:
    return {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def closure(python: str) -> dict[str, str]:
    """{distribution: installed version} of the project's dependency closure for `python`."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = marker_env(python)
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [Requirement(d) for d in deps]
    found: dict[str, str] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            sys.exit(f"gpu_wheels: {req.name} is not installed here; install the project first "
                     "(pip install -e .)")
        found[name] = dist.version
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({**env, "extra": e})
                                         for e in ("", *sorted(req.extras))):
                todo.append(sub)
    return found


def to_carry(python: str) -> dict[str, str]:
    have = device_packages() - {canonicalize_name(n) for n in ALWAYS_CARRY}
    never = {canonicalize_name(n) for n in NEVER_CARRY}
    every = closure(python)
    for name in ALWAYS_CARRY:
        every.setdefault(canonicalize_name(name), md.version(name))
    return {n: v for n, v in sorted(every.items()) if n not in have and n not in never}


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(cmd[:8]), "..." if len(cmd) > 8 else "", flush=True)
    subprocess.run(cmd, check=True)


def target_args(python: str) -> list[str]:
    out = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for p in PLATFORMS:
        out += ["--platform", p]
    return out


def download(pins: dict[str, str], python: str, wheels: Path) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    pip("download", "-q", "--no-deps", *target_args(python), "-d", str(wheels),
        *[f"{n}=={v}" for n, v in pins.items()])
    files = []
    for n, v in pins.items():
        stem = n.replace("-", "_").lower()
        match = [w for w in wheels.glob("*.whl")
                 if canonicalize_name(w.name.split("-")[0]) == n and w.name.split("-")[1] == v]
        if not match:
            sys.exit(f"gpu_wheels: no wheel of {n}=={v} ({stem}) in {wheels}")
        files.append(sorted(match)[-1])
    return files


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def trim(site: Path) -> int:
    """Remove TRIM and every TRIM_NAMES folder, strip STRIP and every *.so; returns the bytes removed."""
    before = size(site)
    for rel in TRIM:
        p = (site / rel).resolve()
        if site.resolve() in p.parents and p.exists():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    for name in TRIM_NAMES:
        for p in sorted(site.rglob(name), reverse=True):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
    tool = shutil.which("strip")
    programs = [site / rel for rel in STRIP if (site / rel).exists()] + sorted(site.rglob("*.so"))
    for path in programs if tool else ():
        subprocess.run([tool, "--strip-unneeded", str(path)], check=True)
    return before - size(site)


def pack(site: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "site.tar.xz"
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        for p in sorted(site.iterdir()):
            tar.add(p, arcname=p.name)
    return archive


def device_view(dest: Path) -> Path:
    """A folder of links to this interpreter's installed distributions that the GPU machine
    also has (gpu_device_packages.txt), and nothing else: with SITE before it on a fresh
    virtual environment's PYTHONPATH, it stands in for the GPU machine's environment."""
    have = device_packages()
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for dist in md.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in have:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (dest / top).exists():
                (dest / top).symlink_to(src)
    return dest


VERIFY = ("import ray, ray.tune, optuna, mlflow, pydantic, plotly; from ray.tune.search.optuna import OptunaSearch; "
          "import service.cli, service.sweep.driver; ray.init(num_cpus=1, include_dashboard=False); "
          "print('resources', ray.cluster_resources()); ray.shutdown()")


def verify(site: Path, build: Path) -> None:
    """Import the sweep's stack and start and stop a Ray in a fresh virtual environment whose
    only packages are SITE and device_view(): a missing dependency fails here, not there."""
    env_dir = build / "verify-venv"
    if not (env_dir / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    view = device_view(build / "device-view")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PYTHONPATH": os.pathsep.join([str(site), str(view), str(ROOT)]), "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled"}
    print("+ verify:", VERIFY, flush=True)
    subprocess.run([str(env_dir / "bin" / "python"), "-c", VERIFY], check=True, env=env, cwd=build)
    print("verify: ok")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default="3.12", help="the GPU machine's Python (major.minor)")
    p.add_argument("--out", type=Path, default=ROOT / ".whl", help="where site.tar.xz goes")
    p.add_argument("--build", type=Path, default=ROOT / "build" / "gpu_wheels")
    p.add_argument("--no-pack", action="store_true", help="stop after trimming SITE")
    p.add_argument("--list", action="store_true", help="print what would be carried and stop")
    p.add_argument("--verify", action="store_true",
                   help="after building SITE for this Python: import Ray, Tune, Optuna, MLflow, pydantic and the "
                        "sweep and start a Ray with SITE and the GPU machine's packages alone")
    a = p.parse_args()
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if a.verify and a.python != here:
        sys.exit(f"gpu_wheels: --verify imports SITE with this Python ({here}); build one with --python {here}")
    tag = "cp" + a.python.replace(".", "")
    pins = to_carry(a.python)
    if a.list:
        for n, v in pins.items():
            print(f"{n}=={v}")
        return
    files = download(pins, a.python, a.build / tag / "wheels")
    site = a.build / tag / "site"
    shutil.rmtree(site, ignore_errors=True)
    pip("install", "-q", "--no-deps", "--no-index", "--no-compile", "--no-cache-dir", "--target", str(site),
        *target_args(a.python), *map(str, files))
    installed = size(site)
    removed = trim(site)
    print(f"{len(files)} distributions, {installed / 2**20:.1f} MiB installed, "
          f"{removed / 2**20:.1f} MiB trimmed, {size(site) / 2**20:.1f} MiB left in {site}")
    if a.verify:
        verify(site, a.build / tag)
    if not a.no_pack:
        archive = pack(site, a.out)
        print(f"{archive}: {archive.stat().st_size / 2**20:.1f} MiB")
        print("on the GPU machine:\n  mkdir -p /tmp/site && tar -xJf .whl/site.tar.xz -C /tmp/site "
              "&& export PYTHONPATH=/tmp/site:$PWD")


if __name__ == "__main__":
    main()
