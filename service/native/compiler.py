"""Small C kernels compiled once with the system C compiler and loaded through ctypes.

`build(name, source)` compiles ``source`` (plain C; AVX2/FMA and AVX-512 paths are selected at run
time with ``__attribute__((target(...)))``, never with ``-march=native``, so one cached
library works on every x86-64 CPU) into ``<cache>/<name>-<hash>.so`` and loads it. The
cache is a private directory (`cache_dir`: ``$NALU_SWEEP_CACHE`` or ``~/.cache/nalu-sweep``,
else ``<tmp>/nalu-sweep-<uid>``, else a fresh temporary one), used only when it is owned by
this user and not writable by group or others, and a library is loaded only when it passes
the same check; the hash covers the source, the compiler and the flags, so an edited
kernel is rebuilt and concurrent builders never see a partial file (atomic rename).

`load(name, setup)` builds ``service/native/<name>.c`` (package data) once per process,
thread-safely, and returns
``setup(lib)`` or ``None`` (with one ``RuntimeWarning``) when no library can be had: no
compiler, a read-only disk, Windows, or ``NALU_SWEEP_NATIVE=0``. Callers then use their
torch-ops path, which gives the same numbers (the rng, the units' kernels: see
`service.native.ordered`).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import stat
import sys
import tempfile
import threading
import warnings
from importlib import resources
from typing import Callable, TypeVar

__all__ = ["build", "load", "source", "cache_dir", "ENV_NATIVE", "UnsafeCacheError"]

ENV_NATIVE = "NALU_SWEEP_NATIVE"  # "0" turns every native kernel off
ENV_CACHE = "NALU_SWEEP_CACHE"  # where compiled kernels are kept
_FLAGS = ["-O3", "-shared", "-fPIC", "-ffp-contract=off"]  # no FMA contraction: exact float ops

T = TypeVar("T")
_lock = threading.Lock()
_loaded: dict[str, object] = {}
errors: dict[str, str] = {}
"""Why a library could not be had, by name (for diagnostics)."""


class UnsafeCacheError(RuntimeError):
    """A cache directory or library that another user could have written."""


def check_private(path: str, *, is_dir: bool) -> None:
    """Raise `UnsafeCacheError` unless ``path`` is owned by this user and not writable by
    its group or others (a directory, or a regular file that is not a link)."""
    st = os.stat(path) if is_dir else os.lstat(path)
    kind_ok = stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        raise UnsafeCacheError(f"{path} is not a {'directory' if is_dir else 'regular file'}")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise UnsafeCacheError(f"{path} is owned by uid {st.st_uid}, not by this user ({os.getuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(f"{path} is writable by its group or others (mode {stat.S_IMODE(st.st_mode):o})")


def _private_dir(path: str) -> str:
    """``path``, created with mode 0700 if missing; raises when it is unusable or unsafe."""
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)  # makedirs' mode is subject to the umask
    check_private(path, is_dir=True)
    if not os.access(path, os.W_OK | os.X_OK):
        raise OSError(f"{path} is not writable")
    return path


def cache_dir() -> str:
    """A private directory for compiled kernels: ``$NALU_SWEEP_CACHE``, else
    ``$XDG_CACHE_HOME/nalu-sweep`` (``~/.cache/nalu-sweep``), else
    ``<tmp>/nalu-sweep-<uid>``, else a fresh ``mkdtemp`` directory (a rebuild per process).
    A candidate is used only if it is owned by this user and not group/world-writable
    (a created one gets mode 0700); one that fails is skipped with a warning."""
    candidates = []
    if os.environ.get(ENV_CACHE):
        candidates.append(os.environ[ENV_CACHE])
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        candidates.append(os.path.join(xdg, "nalu-sweep"))
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    candidates.append(os.path.join(tempfile.gettempdir(), f"nalu-sweep-{uid}"))
    for path in candidates:
        try:
            return _private_dir(path)
        except UnsafeCacheError as e:
            warnings.warn(f"service.native: not using kernel cache {path}: {e}", RuntimeWarning)
        except OSError:
            pass
    return tempfile.mkdtemp(prefix="nalu-sweep-")  # mode 0700, ours


def source(name: str) -> str:
    """The C source ``service/native/<name>.c`` (package data)."""
    return resources.files(__package__).joinpath(f"{name}.c").read_text(encoding="utf-8")


def build(name: str, source: str) -> ctypes.CDLL:
    """Compile ``source`` into the cache (once) and load it; raises when that fails."""
    if sys.platform == "win32":
        raise RuntimeError("native kernels are built with a Unix C compiler only")
    cc = shlex.split(os.environ.get("CC") or "") or [shutil.which("cc") or shutil.which("gcc") or "gcc"]
    if not shutil.which(cc[0]):
        raise RuntimeError(f"no C compiler {cc[0]!r} found (set CC)")
    tag = hashlib.sha256("\0".join([source, *cc, *_FLAGS, platform.machine()]).encode()).hexdigest()[:16]
    d = cache_dir()
    so = os.path.join(d, f"{name}-{tag}.so")
    if not os.path.exists(so):
        fd, src = tempfile.mkstemp(suffix=".c", dir=d)
        tmp_so = src[:-2] + ".so"
        try:
            with os.fdopen(fd, "w") as f:
                f.write(source)
            proc = subprocess.run([*cc, *_FLAGS, src, "-o", tmp_so], capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"{cc[0]} failed: {proc.stderr.strip()[-2000:]}")
            os.chmod(tmp_so, 0o700)  # whatever the umask: ours alone
            os.replace(tmp_so, so)  # atomic: concurrent builders never see a partial file
        finally:
            for p in (src, tmp_so):
                if os.path.exists(p):
                    os.unlink(p)
    check_private(so, is_dir=False)  # never load a library someone else could have written
    return ctypes.CDLL(so)


def load(name: str, setup: Callable[[ctypes.CDLL], T], env: str | None = None) -> T | None:
    """``setup(build(name, source(name)))``, once per process; ``None`` (and one warning)
    when the library cannot be built or loaded, or when ``NALU_SWEEP_NATIVE`` (or ``env``)
    is "0"."""
    if name in _loaded:
        return _loaded[name]  # type: ignore[return-value]
    with _lock:
        if name not in _loaded:
            value = None
            try:
                if os.environ.get(ENV_NATIVE, "1") != "0" and (env is None or os.environ.get(env, "1") != "0"):
                    value = setup(build(name, source(name)))
            except Exception as e:  # no compiler, read-only disk, exotic platform: torch ops
                errors[name] = repr(e)
                warnings.warn(f"service.native: {name} kernel unavailable, using torch ops ({e})", RuntimeWarning)
                value = None
            _loaded[name] = value
    return _loaded[name]  # type: ignore[return-value]


# -- the C allocator ------------------------------------------------------------------------------
ENV_MALLOPT = "NALU_SWEEP_MALLOPT"  # "0" leaves glibc's allocation policy alone
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_malloc_tuned: list[bool] = []


def retain_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of giving it back to the OS.

    A training step frees and re-allocates the same multi-MB buffers every step (inside a
    compiled graph they cannot be reused by hand). By default glibc serves blocks above
    ~32 MB with a fresh ``mmap`` and unmaps them on ``free``, so every step touches new
    pages: at 1000 seeds (a 51 MB batch) ~12,500 page faults and ~30 ms per step on a VM.
    Here all blocks come from the heap (``M_MMAP_MAX = 0``) and the heap is not trimmed
    below 1 GiB of free space, so the process keeps its peak footprint. Once per process;
    glibc (Linux) only; ``NALU_SWEEP_MALLOPT=0`` turns it off. Returns whether it is on.
    """
    if _malloc_tuned:
        return _malloc_tuned[0]
    ok = False
    if os.environ.get(ENV_MALLOPT, "1") != "0" and sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        try:
            libc = ctypes.CDLL(None)
            ok = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
        except (OSError, AttributeError):
            ok = False
    _malloc_tuned.append(ok)
    return ok

