"""A sweep whose driver is SIGKILLed at each kind of moment, and resumed each time, ends
with exactly its planned trials (issue 43): every setting trained once, as many MLflow
child runs as finished Optuna trials as planned, no FAIL trial in the study, and nothing
alarming printed. The moments are the driver's own (`service.sweep.kill_points`), not
sleeps (slow: real Ray, Optuna, MLflow, one nalu-sweep process per round)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import optuna
import pytest
import yaml

from service.sweep.kill_points import ENV
from service.tracking import runs, store
from service.tracking.queries import validation_runs

TRIALS = 6
SPEC = {
    "name": "killed", "steps": 300, "eval_every": 50, "seeds": 4,
    "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
    "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
              "train": {"batch_size": 32}},
    "params": {
        "lr": {"type": "loguniform", "low": 1e-2, "high": 0.3, "target": "train.optimizer.lr"},
        "optimizer": {"type": "categorical", "choices": ["adam", "rmsprop"], "target": "train.optimizer.name"},
    },
    "trials": TRIALS, "concurrency": 2, "scheduler": {"type": "asha", "grace_period": 100, "reduction_factor": 2},
    "sampler": {"type": "tpe", "seed": 0},
}
# (the moment the driver kills itself at, extra flags of that round); a last round resumes to the end
BEFORE_TRIALS = ("before_trials", [])  # the Optuna-storage case only: the others resume nothing from it
ROUNDS = [
    ("trial_started:3", []),  # the third trial this driver asks, two others running
    ("trial_finished:2", []),  # the second trial this driver sees end, before Tune's next snapshot
    ("validation", ["--validate", "1", "--validate-seeds", "4"]),
]


def _calm(out: str) -> None:
    assert "Traceback" not in out, out
    assert not re.search(r"^.*WARNING.*$", out, re.M), out


@pytest.mark.slow
@pytest.mark.parametrize(("with_db", "pack"), [(True, 1), (False, 1), (True, 2)],
                         ids=["optuna-storage", "in-memory-study", "packed"])
def test_a_sweep_killed_at_every_moment_ends_with_its_plan(ray_address, tmp_path, monkeypatch, cli_process,
                                                           with_db, pack):
    """``packed``: three packs of two members (the members of a pack share the optimizer);
    a moment counts packs, as Tune's trials."""
    (tmp_path / "killed.yaml").write_text(yaml.safe_dump({**SPEC, "pack": pack}))
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    args = ["sweep", "killed.yaml", *(["--optuna-storage", url] if with_db else [])]
    for number, (moment, flags) in enumerate([BEFORE_TRIALS, *ROUNDS] if with_db and pack == 1 else ROUNDS):
        monkeypatch.setenv(ENV, moment)
        killed = cli_process([*args, *flags, *(["--resume"] if number else [])], tmp_path, ray_address)
        assert killed.returncode == -signal.SIGKILL, (moment, killed.stdout)
        _calm(killed.stdout)
    monkeypatch.delenv(ENV)
    done = cli_process([*args, "--resume", "--validate", "1", "--validate-seeds", "4"], tmp_path, ray_address)
    assert done.returncode == 0, done.stdout
    _calm(done.stdout)

    status = subprocess.run([sys.executable, "-c", "from service.cli import app; app()", "status", "killed"],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert f"{TRIALS}/{TRIALS}" in status, status

    client = store.client(store.resolve_tracking_uri(None))
    experiment = client.get_experiment_by_name("killed")
    parent = runs.find_sweep_run(client, experiment.experiment_id, "killed")
    children = runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)
    outcomes = sorted(c.data.tags[store.TAG_OUTCOME] for c in children)
    assert len(children) == TRIALS and set(outcomes) <= {"completed", "pruned"}, outcomes
    settings = {(c.data.params["lr"], c.data.params["optimizer"]) for c in children}
    assert len(settings) == TRIALS, "a setting was trained twice"
    numbers = sorted(int(c.data.tags[store.TAG_OPTUNA_TRIAL]) for c in children)
    assert numbers == list(range(TRIALS)), numbers
    assert len(validation_runs(client, experiment.experiment_id, parent.info.run_id)) == 1
    if with_db:
        study = optuna.load_study(study_name="killed", storage=url)
        States = optuna.trial.TrialState
        assert [t.state for t in study.trials].count(States.FAIL) == 0, study.trials
        assert len(study.trials) == TRIALS
        by_number = {int(c.data.tags[store.TAG_OPTUNA_TRIAL]): c for c in children}
        for trial in study.trials:
            run = by_number[trial.number]
            expected = States.COMPLETE if run.data.tags[store.TAG_OUTCOME] == "completed" else States.PRUNED
            assert trial.state == expected, (trial.number, trial.state, run.data.tags[store.TAG_OUTCOME])
            assert trial.params["lr"] == pytest.approx(float(run.data.params["lr"]))
