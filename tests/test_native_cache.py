"""The kernel cache of `service.native`: a private directory (owned by this user, not
group/world-writable), and no library loaded that another user could have written."""

from __future__ import annotations

import os
import stat
import tempfile
import warnings

import pytest

from service import native
from service.native import compiler

SOURCE = "int nalu_cache_probe(void) { return 7; }\n"


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    """Candidates under tmp_path only: $NALU_SWEEP_CACHE and the temporary-directory one."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    return tmp_path


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_created_cache_is_private(tmp_root, monkeypatch):
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_root / "cache"))
    old = os.umask(0)
    try:
        assert native.cache_dir() == str(tmp_root / "cache")
    finally:
        os.umask(old)
    assert _mode(tmp_root / "cache") == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_group_or_world_writable_cache_is_refused(tmp_root, monkeypatch, mode):
    bad = tmp_root / "shared"
    bad.mkdir()
    os.chmod(bad, mode)
    monkeypatch.setenv(native.ENV_CACHE, str(bad))
    with pytest.warns(RuntimeWarning, match="writable by its group or others"):
        d = native.cache_dir()
    assert d != str(bad) and _mode(d) == 0o700 and os.stat(d).st_uid == os.getuid()


def test_cache_owned_by_someone_else_is_refused(tmp_root, monkeypatch):
    theirs = tmp_root / "theirs"
    theirs.mkdir(mode=0o700)
    monkeypatch.setenv(native.ENV_CACHE, str(theirs))
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)  # the directory now belongs to "another" user
    with pytest.warns(RuntimeWarning, match="owned by uid"):
        d = native.cache_dir()
    assert d != str(theirs)


def test_planted_tmp_fallback_is_not_used(tmp_root, monkeypatch):
    """The old fallback: <tmp>/nalu-sweep-<uid> made by someone else, world-writable."""
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_root / "not-a-dir"))
    (tmp_root / "not-a-dir").write_text("")  # first candidate unusable
    planted = tmp_root / "tmp" / f"nalu-sweep-{os.getuid()}"
    planted.mkdir()
    os.chmod(planted, 0o777)
    with pytest.warns(RuntimeWarning):
        d = native.cache_dir()
    assert d != str(planted) and _mode(d) == 0o700


def test_library_writable_by_others_is_not_loaded(tmp_root, monkeypatch):
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_root / "cache"))
    lib = native.build("probe", SOURCE)
    assert lib.nalu_cache_probe() == 7
    (so,) = (tmp_root / "cache").glob("probe-*.so")
    assert _mode(so) & 0o022 == 0
    os.chmod(so, 0o666)  # as if planted or tampered with
    with pytest.raises(native.UnsafeCacheError):
        native.build("probe", SOURCE)
    # load(): no exception, one warning, None (callers use torch ops)
    monkeypatch.setattr(compiler, "source", lambda name: SOURCE)
    monkeypatch.setattr(compiler, "_loaded", {})
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert native.load("probe", lambda lib: lib) is None
    assert any("unavailable" in str(x.message) for x in w)


def test_sources_are_package_data():
    for name in ("philox", "units"):
        assert "#include <stdint.h>" in native.source(name)
