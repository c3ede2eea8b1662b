"""How a sweep starts: Ray Tune's checks and the MLflow store's opening run while Ray
starts, and a sweep refused on what they say stops the local Ray it started. Ray is
replaced here by stand-ins that record the order of things (the real start is every sweep
test's)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from service.errors import UserError
from service.search.loading import load_space, with_overrides
from service.sweep import driver
from service.tracking import runs, store

SMOKE = Path(__file__).resolve().parents[2] / "search_spaces" / "smoke.yaml"


@pytest.fixture
def space():
    return with_overrides(load_space(SMOKE), "test", trials=1, seeds=2, steps=10, eval_every=5)


def _options(tmp_path: Path, **kw) -> driver.SweepOptions:
    return driver.SweepOptions(name="start", tracking_uri=store.default_tracking_uri(tmp_path),
                               storage_path=str(tmp_path / "runs"), **kw)


def test_the_store_opens_on_a_thread_while_ray_starts(tmp_path, monkeypatch, space):
    """Each side waits to see the other under way: both do only if they overlap."""
    opening, starting = threading.Event(), threading.Event()
    seen = {}
    real_open = driver._open_store

    def open_store(options):
        seen["thread"] = threading.current_thread() is not threading.main_thread()
        opening.set()
        seen["ray seen from the store"] = starting.wait(timeout=20)
        return real_open(options)

    def init_ray(address, verbose, say=None):
        starting.set()
        seen["store seen from Ray"] = opening.wait(timeout=20)
        return False

    monkeypatch.setattr(driver, "_open_store", open_store)
    monkeypatch.setattr(driver, "init_ray", init_ray)
    monkeypatch.setattr(driver, "check_resources", lambda space: (_ for _ in ()).throw(UserError("stop here")))
    options = _options(tmp_path)
    with pytest.raises(UserError, match="stop here"):
        driver.run_sweep(space, options)
    assert seen == {"thread": True, "ray seen from the store": True, "store seen from Ray": True}


def test_a_sweep_refused_on_what_the_store_says_stops_the_ray_it_started(tmp_path, monkeypatch, space):
    options = _options(tmp_path)
    client = store.client(options.tracking_uri)
    experiment_id = store.ensure_experiment(client, options.name, options.tracking_uri)
    runs.start_sweep_run(client, experiment_id, options.name, space_file=None, spec_json=space.spec_json(),
                         spec_hash=space.spec_hash(), storage_path="elsewhere", params={})
    stopped = []
    monkeypatch.setattr(driver, "init_ray", lambda address, verbose, say=None: True)
    monkeypatch.setattr(driver, "stop_ray", lambda: stopped.append(True))
    with pytest.raises(UserError, match="sweep 'start' already exists"):
        driver.run_sweep(space, options)  # no Tune experiment here: only MLflow knows the name
    assert stopped == [True]


def test_a_taken_tune_directory_is_refused_and_the_ray_started_meanwhile_stopped(tmp_path, monkeypatch, space):
    """Tune's check needs Ray Tune imported (about 1.5 s): it runs while Ray starts, and a
    refusal stops that Ray; the store is not opened for a refused sweep."""
    options = _options(tmp_path)
    stopped = []
    monkeypatch.setattr(driver, "init_ray", lambda *a, **k: True)
    monkeypatch.setattr(driver, "stop_ray", lambda: stopped.append(True))
    monkeypatch.setattr(driver, "_open_store", lambda options: pytest.fail("the store opened for a refused sweep"))
    from ray import tune

    monkeypatch.setattr(tune.Tuner, "can_restore", staticmethod(lambda path: True))
    with pytest.raises(UserError, match="already exists"):
        driver.run_sweep(space, options)
    assert stopped == [True]


def test_optuna_loads_after_ray_starts_and_keeps_its_messages_to_warnings(tmp_path):
    """Loading what a sweep needs before it starts Ray loads no Optuna (0.1-0.2 s that would
    delay Ray's start); `quiet_optuna`, on the thread that runs while Ray starts, loads it
    and keeps its messages to warnings, also after Optuna's first use."""
    import subprocess
    import sys

    code = (
        "import sys, logging\n"
        "import service.__main__, service.cli.sweep, service.sweep.driver\n"
        "from service.sweep.cluster import quiet_libraries, quiet_optuna\n"
        "quiet_libraries(False)\n"
        "print('optuna' in sys.modules)\n"
        "quiet_optuna(False)\n"
        "import optuna\n"
        "optuna.create_study()\n"
        "print(logging.getLogger('optuna').level == logging.WARNING)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
    assert "A new study created" not in out.stderr
