"""The lean head's start without Ray's fixed waits (`service.sweep.head_waits`): the node's
registration polled finely, the raylet's store connection retried every 100 ms with Ray's
patience, and the dashboard-dependency check answered without imports where a dependency is
missing. A real start is checked in tests/sweep/test_ray_stop.py."""

from __future__ import annotations

import time

import pytest

from service.sweep import head_waits


def test_the_raylet_retries_often_with_rays_patience(monkeypatch):
    monkeypatch.delenv(head_waits.RETRY_MS_SETTING, raising=False)
    monkeypatch.delenv(head_waits.ATTEMPTS_SETTING, raising=False)
    env = head_waits.raylet_env()
    assert int(env[head_waits.RETRY_MS_SETTING]) <= 100
    assert int(env[head_waits.RETRY_MS_SETTING]) * int(env[head_waits.ATTEMPTS_SETTING]) == 1000 * 10  # Ray's 10 s


@pytest.mark.parametrize("setting", [head_waits.RETRY_MS_SETTING, head_waits.ATTEMPTS_SETTING])
def test_a_users_retry_setting_is_left_alone(monkeypatch, setting):
    monkeypatch.delenv(head_waits.RETRY_MS_SETTING, raising=False)
    monkeypatch.delenv(head_waits.ATTEMPTS_SETTING, raising=False)
    monkeypatch.setenv(setting, "5000")
    assert head_waits.raylet_env() == {}


def _module(tmp_path, monkeypatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_missing_dependency_is_found_without_importing(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "deps_missing", (
        "import json\nimport os.path  # noqa\nfrom collections import abc\n"
        "import nalu_sweep_surely_not_installed.sub\nraise AssertionError('imported')\n"))
    assert head_waits.missing_dependency(name) == "nalu_sweep_surely_not_installed"
    assert head_waits.missing_dependency(_module(tmp_path, monkeypatch, "deps_there", "import json\n")) is None
    assert head_waits.missing_dependency("nalu_sweep_no_such_module") is None  # unknown: Ray decides


def test_the_check_answers_for_a_missing_dependency_and_asks_ray_otherwise(monkeypatch):
    asked = []

    def rays_check():
        asked.append(1)

    check = head_waits._dependency_check(rays_check)
    monkeypatch.setattr(head_waits, "missing_dependency", lambda module=None: "aiohttp_cors")
    error = check()
    assert isinstance(error, ImportError) and "aiohttp_cors" in str(error) and asked == []
    monkeypatch.setattr(head_waits, "missing_dependency", lambda module=None: None)
    assert check() is None and asked == [1]


def test_this_installs_check_agrees_with_rays():
    from ray._private import utils

    ours = head_waits._dependency_check(lambda: None)()
    theirs = utils.get_dashboard_dependency_error()
    assert (ours is None) == (theirs is None)


def test_the_node_is_seen_within_a_poll_of_its_registration():
    registered_at = time.monotonic() + 0.3
    errors = iter([ConnectionError("GCS not up")])

    def alive():
        for e in errors:
            raise e
        return time.monotonic() >= registered_at

    assert head_waits.registered_node("gcs", "node", alive=alive)
    assert time.monotonic() - registered_at < 0.2  # Ray's own lookup: up to a second later


def test_a_node_that_never_registers_is_left_to_rays_own_wait():
    started = time.monotonic()
    assert not head_waits.registered_node("gcs", "node", alive=lambda: False, patience_s=0.2)
    assert time.monotonic() - started < 1


def test_rays_functions_are_back_afterwards():
    from ray._private import services, utils

    lookup, check = services.get_node, utils.get_dashboard_dependency_error
    with pytest.raises(RuntimeError), head_waits.without_fixed_waits() as applied:
        assert applied
        assert services.get_node is not lookup and utils.get_dashboard_dependency_error is not check
        raise RuntimeError("ray.init failed")
    assert services.get_node is lookup and utils.get_dashboard_dependency_error is check
