"""GPUs per trial: what the sweep refuses before it starts, four trials packed on one
(fake) GPU with ``gpus: 0.25``, and, where torch sees CUDA, a real GPU sweep with
``--validate``.

Ray's fake GPUs (``ray.init(num_gpus=1)``) exercise its scheduling and
``CUDA_VISIBLE_DEVICES`` without a GPU; torch still sees none, so ``device: auto`` trains
on the CPU there (expected). Each sweep runs in a process of its own: the test session's
shared Ray has no GPUs, and a second Ray cannot be started beside it in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from service.errors import UserError
from service.search.space import SearchSpace
from service.sweep.cluster import check_resources, gpu_ids, gpu_request_problem
from service.tracking import runs, store

REPO = Path(__file__).resolve().parents[2]

# The driver, in a process that owns its Ray: the sweep finds it running and uses it.
FAKE_GPU_DRIVER = ("import ray; ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False); "
                   "from service.cli import app; app()")
CLI = "from service.cli import app; app()"


def _space(tmp_path: Path, name: str, **overrides) -> Path:
    data = {
        "name": name,
        "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "train": {"batch_size": 16},
                  "device": "auto", "compile": "off"},
        "params": {"lr": {"type": "loguniform", "low": 1e-2, "high": 1e-1, "target": "train.optimizer.lr"}},
        "seeds": 1, "steps": 1500, "eval_every": 500, "trials": 4, "concurrency": 4,
        "scheduler": {"type": "none"}, "resources": {"cpus": 0.5, "gpus": 0.25}, "retries": 0,
        "checkpoint_every": 0, "sampler": {"type": "random", "seed": 0},
        **overrides,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(code: str, args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    paths = [str(REPO), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}  # Ray's workers import `service`
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _trials(tmp_path: Path, name: str):
    client = store.client(store.default_tracking_uri(tmp_path))
    experiment = client.get_experiment_by_name(name)
    parent = runs.find_sweep_run(client, experiment.experiment_id, name)
    return client, parent, runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)


# -- refused before anything starts ----------------------------------------------------------------------------
def _cluster(monkeypatch, *nodes: dict[str, float]) -> None:
    import ray

    total = {key: sum(n.get(key, 0.0) for n in nodes) for key in ("CPU", "GPU")}
    monkeypatch.setattr(ray, "cluster_resources", lambda: {k: v for k, v in total.items() if v})
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "Resources": n} for n in nodes]
                        + [{"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}])


def _resources(cpus: float = 1.0, gpus: float = 0.0) -> SearchSpace:
    return SearchSpace.model_validate({"name": "r", "task": {"kind": "small_mul"}, "steps": 10,
                                       "resources": {"cpus": cpus, "gpus": gpus}})


def test_gpu_requests_ray_would_refuse():
    for fine in (0, 0.25, 0.3, 0.0001, 1, 2, 8):
        assert gpu_request_problem(fine) is None, fine
    assert "whole" in gpu_request_problem(1.5) and "use 1 or 2" in gpu_request_problem(1.5)
    assert "0.0001" in gpu_request_problem(0.00001)


def test_check_resources_says_what_is_missing(monkeypatch):
    _cluster(monkeypatch, {"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0})
    check_resources(_resources(cpus=0.5, gpus=0.25))
    check_resources(_resources(cpus=4, gpus=1))
    with pytest.raises(UserError, match=r"asks for 3 GPU\(s\) but the Ray cluster has 2"):
        check_resources(_resources(gpus=3))
    with pytest.raises(UserError, match=r"asks for 2 GPU\(s\) but the largest Ray node has 1 \(the cluster 2 in all\)"):
        check_resources(_resources(gpus=2))
    with pytest.raises(UserError, match=r"asks for 6 CPUs but the largest Ray node has 4"):
        check_resources(_resources(cpus=6))
    with pytest.raises(UserError, match="1.5 GPUs; Ray shares a GPU only below one"):
        check_resources(_resources(gpus=1.5))
    _cluster(monkeypatch, {"CPU": 2.0})
    with pytest.raises(UserError, match=r"asks for 0.25 GPU\(s\) but the Ray cluster has 0; use --gpus-per-trial 0"):
        check_resources(_resources(gpus=0.25))


def test_gpu_ids_outside_a_trial():
    assert gpu_ids() in ("none", "unknown")


# -- four trials on one fake GPU -------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_quarter_gpu_each_packs_four_trials_on_one_gpu(tmp_path):
    """``gpus: 0.25`` on a Ray with one (fake) GPU and 4 CPUs: the four trials run at once,
    each told GPU 0; where torch sees no CUDA they train on the CPU (on a GPU machine, on
    its GPU 0)."""
    space = _space(tmp_path, "packed")
    done = _run(FAKE_GPU_DRIVER, ["sweep", str(space)], tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _, parent, trials = _trials(tmp_path, "packed")
    assert parent.data.params["gpus_per_trial"] == "0.25"
    assert len(trials) == 4
    for trial in trials:
        assert trial.data.tags[store.TAG_OUTCOME] == "completed", trial.data.tags
        assert trial.data.tags[store.TAG_GPU_IDS] == "0"  # the one GPU, a quarter each
        # device auto: the CPU where torch sees no CUDA; on a GPU machine, the real GPU 0 Ray named
        device = trial.data.tags[store.TAG_DEVICE]
        assert device.startswith("cuda:") if torch.cuda.is_available() else device == "cpu", device
    spans = sorted((t.info.start_time, t.info.end_time) for t in trials)
    last_start, first_end = max(s for s, _ in spans), min(e for _, e in spans)
    assert last_start < first_end, f"the trials did not all run at once: {spans}"


# -- a real GPU --------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_sweep_shares_the_gpu_and_validates_on_it(tmp_path):
    """Two trials of half a GPU each at once, then ``--validate 1``: every trial trained on a
    CUDA device Ray gave it, and the validation run did too. The step compiles (``compile:
    auto`` on a GPU) and replays CUDA graphs, as in a real sweep."""
    fixed = {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "train": {"batch_size": 64},
             "device": "auto", "compile": "auto"}
    space = _space(tmp_path, "gpu", trials=2, concurrency=2, steps=2000, seeds=4, fixed=fixed,
                   resources={"cpus": 1, "gpus": 0.5})
    done = _run(CLI, ["sweep", str(space), "--validate", "1", "--validate-seeds", "4"], tmp_path, timeout=500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client, parent, trials = _trials(tmp_path, "gpu")
    assert len(trials) == 2
    for trial in trials:
        tags = trial.data.tags
        assert tags[store.TAG_OUTCOME] == "completed", tags
        assert tags[store.TAG_DEVICE].startswith("cuda:"), tags
        assert tags[store.TAG_GPU_IDS] not in ("none", "unknown", ""), tags
    validations = runs.all_runs(client, [parent.info.experiment_id],
                                f"tags.`{store.TAG_ROLE}` = '{store.ROLE_VALIDATION}'")
    assert len(validations) == 1
    assert validations[0].data.tags[store.TAG_DEVICE].startswith("cuda:")
