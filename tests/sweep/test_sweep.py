"""End to end with real Ray, Optuna and MLflow (slow; one Ray for the session): a smoke
sweep, the CLI verbs over its MLflow store, and resuming after the driver was killed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.search.loading import load_space, with_overrides
from service.tracking import runs, store

SMOKE = str(Path(__file__).resolve().parents[2] / "search_spaces" / "smoke.yaml")
runner = CliRunner()


def _children(name: str):
    client = store.client(store.resolve_tracking_uri(None))
    experiment = client.get_experiment_by_name(name)
    parent = runs.find_sweep_run(client, experiment.experiment_id, name)
    return client, parent, runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)


@pytest.mark.slow
def test_smoke_sweep_records_one_parent_and_one_child_per_trial(ray_address, sweep_checks):
    # one trial at a time: which trials ASHA stops then follows from the seeded sampler
    # (the settings) and the seeds (their reports), not from which trial reports first
    args = ["--trials", "4", "--seeds", "4", "--concurrency", "1"]
    result = runner.invoke(app, ["sweep", SMOKE, *args, "--name", "smoke-e2e"])
    assert result.exit_code == 0, result.output
    assert "sweep smoke-e2e completed" in result.output
    text = " ".join(result.output.split())  # rich wraps long lines
    for needle in ("best setting: ", "nalu-sweep validate smoke-e2e --top 3", "nalu-sweep report smoke-e2e",
                   "/runs?workflowType=machine_learning"):
        assert needle in text, needle  # the sweep ends with its answer so far and the next command

    client, parent, children = _children("smoke-e2e")
    assert parent.info.status == "FINISHED"
    assert parent.data.tags[store.TAG_SPACE_HASH] and parent.data.tags[store.TAG_GIT_COMMIT]
    spec_files = {a.path for a in client.list_artifacts(parent.info.run_id, "search_space")}
    assert spec_files == {"search_space/smoke.yaml", "search_space/resolved_spec.json"}
    experiments = [e for e in client.search_experiments() if e.name == "smoke-e2e"]
    assert len(experiments) == 1 and experiments[0].artifact_location.startswith("file:///")

    assert len(children) == 4
    assert len({c.data.tags[store.TAG_TRIAL_KEY] for c in children}) == 4
    completed = []
    for child in children:
        tags, metrics = child.data.tags, child.data.metrics
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.info.status == "FINISHED"
        assert {"lr", "optimizer", "lambda_max", "nau_init", "task.kind", "seeds"} <= set(child.data.params)
        assert ("momentum" in child.data.params) == (child.data.params["optimizer"] == "sgd")
        assert "master_seed" not in child.data.params  # searched, task and schedule parameters only
        # the schedule the trial trained with (smoke.yaml states it; λ_max is searched)
        assert float(child.data.params["regularizer.lambda_max"]) == float(child.data.params["lambda_max"])
        assert (child.data.params["regularizer.t_start"], child.data.params["regularizer.t_end"]) == ("300", "1200")
        assert child.data.params["regularizer.source"] == "config"
        assert child.data.params["compile_mode"] == "eager"  # smoke.yaml's short runs, on the CPU
        for key in ("objective", "success_rate", "success_ci_low", "success_ci_high", "diverged",
                    "interpolation_mse_median", "extrapolation_mse_median.extrapolation"):
            assert key in metrics, key
        assert len(client.get_metric_history(child.info.run_id, "success_ci_low")) >= 4
        if tags[store.TAG_OUTCOME] == "completed":
            completed.append(child)
            assert metrics["n_seeds"] == 4
            files = {a.path for a in client.list_artifacts(child.info.run_id)}
            files |= {a.path for d in ("weights", "plots") for a in client.list_artifacts(child.info.run_id, d)}
            assert {"seeds.csv", "weights/best_seed.json", "plots/curves.png", "plots/weights.png"} <= files
    assert completed, "ASHA always lets at least one trial finish"
    # exactly the trials ASHA's rule, maximising, stops given what each reported
    space = with_overrides(load_space(Path(SMOKE)), trials=4, seeds=4, concurrency=1)
    children.sort(key=sweep_checks.optuna_number)
    kept = sweep_checks.asha_replay(space, [sweep_checks.objective_reports(space, client, c) for c in children])
    assert [c.data.tags[store.TAG_OUTCOME] for c in children] == ["completed" if k else "pruned" for k in kept]

    best = runner.invoke(app, ["best", "smoke-e2e", "--top", "3"])
    assert best.exit_code == 0, best.output
    trial_name = "trial-" + completed[0].data.tags["nalu_sweep.trial_key"]
    for text in ("lr", "optimizer", "success [95% CI]", "solved_at median", "sparsity error", trial_name):
        assert text in best.output, text

    status = runner.invoke(app, ["status"])
    assert status.exit_code == 0 and "smoke-e2e" in status.output and "4/4" in status.output
    status = runner.invoke(app, ["status", "smoke-e2e"])
    assert status.exit_code == 0 and "trials of smoke-e2e" in status.output

    again = runner.invoke(app, ["sweep", SMOKE, *args, "--name", "smoke-e2e"])
    assert again.exit_code == 2 and "already exists" in again.output and "--resume" in again.output


@pytest.mark.slow
def test_a_trial_asking_for_a_missing_gpu_is_refused_before_anything_is_recorded(ray_address):
    result = runner.invoke(app, ["sweep", SMOKE, "--gpus-per-trial", "0.25", "--name", "gpu"])
    assert result.exit_code == 2, result.output
    assert "asks for 0.25 GPU(s) but the Ray cluster has 0" in result.output
    client = store.client(store.resolve_tracking_uri(None))
    assert client.get_experiment_by_name("gpu") is None


def _finished_trials(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            return conn.execute("SELECT COUNT(*) FROM tags WHERE key = ? AND value IN ('completed', 'pruned')",
                                (store.TAG_OUTCOME,)).fetchone()[0]
    except sqlite3.Error:
        return 0


@pytest.mark.slow
def test_resume_after_the_driver_is_killed(ray_address, tmp_path, driver_killed_when, cli_process, sweep_checks):
    """SIGKILL the driver mid-sweep, then ``--resume``: every trial once in MLflow and
    finished, nothing left RUNNING, and the Optuna study (kept in SQLite) agrees: no trial
    RUNNING, one finished Optuna trial per Tune trial, with MLflow's objective. Neither run
    prints a traceback or Tune's checkpoint errors, and Tune's warning that it snapshots its
    state too often comes at most once (issue 34: checkpoints kept as Tune expects)."""
    import optuna

    import yaml

    study_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    # smoke.yaml with a rung halfway, so that ASHA can stop trials before and after the kill
    space = with_overrides(load_space(Path(SMOKE)), trials=4, seeds=4, steps=1000)
    space = with_overrides(space, scheduler={**space.scheduler.model_dump(mode="json"), "grace_period": 500})
    space_file = tmp_path / "smoke.yaml"
    space_file.write_text(yaml.safe_dump(space.model_dump(mode="json")))
    args = ["sweep", str(space_file), "--name", "resume-e2e", "--optuna-storage", study_url]
    first = driver_killed_when(args, tmp_path, ray_address, lambda: _finished_trials(tmp_path / "mlflow.db") >= 1)
    assert _finished_trials(tmp_path / "mlflow.db") < 4, "the sweep finished before it could be killed"

    resumed = cli_process([*args, "--resume"], tmp_path, ray_address)
    assert resumed.returncode == 0, resumed.stdout
    for out in (first, resumed.stdout):
        assert "Traceback" not in out and "Error handling checkpoint" not in out, out
        assert out.count("snapshotting has been triggered multiple times") <= 1, out

    client, parent, children = _children("resume-e2e")
    assert parent.info.status == "FINISHED"
    keys = [c.data.tags[store.TAG_TRIAL_KEY] for c in children]
    assert len(keys) == len(set(keys)) == 4, keys  # every trial exactly once
    for child in children:
        assert child.info.status == "FINISHED", (child.info.run_name, child.data.tags)
    experiment = client.get_experiment_by_name("resume-e2e")
    assert not client.search_runs([experiment.experiment_id], "attributes.status = 'RUNNING'")

    states = optuna.trial.TrialState
    study = optuna.load_study(study_name="resume-e2e", storage=study_url)
    assert all(t.state in (states.COMPLETE, states.PRUNED, states.FAIL) for t in study.trials), \
        [(t.number, t.state) for t in study.trials]
    told = [t for t in study.trials if t.state != states.FAIL]  # FAIL: asked, then abandoned by the kill
    assert len(told) == len(children) == 4
    optuna_objectives = {t.params["lr"]: t.value for t in told}
    mlflow_objectives = {float(c.data.params["lr"]): c.data.metrics["objective"] for c in children}
    assert optuna_objectives == pytest.approx(mlflow_objectives)
    for child in children:  # each run names its own Optuna trial
        trial = study.trials[int(child.data.tags[store.TAG_OPTUNA_TRIAL])]
        assert trial.state != states.FAIL and trial.params["lr"] == pytest.approx(float(child.data.params["lr"]))
    # each as its run ended (PRUNED or COMPLETE), with the reports it made, whether the
    # killed driver or the resumed one told the study
    sweep_checks.assert_study_agrees(space, client, children, study)
