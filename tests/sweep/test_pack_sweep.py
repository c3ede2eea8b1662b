"""Packed sweeps (``pack: K``) end to end with real Ray Tune, Optuna, MLflow and torch: each
member of a pack is its own Optuna trial and MLflow child run, gets its own ASHA decision,
and trains bit for bit as the same trial alone (slow)."""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pytest
from rich.console import Console
from typer.testing import CliRunner

from service.cli import app
from service.search.assign import run_configs
from service.search.loading import parse_space
from service.sweep import driver
from service.sweep.trial import params_digest
from service.tracking import runs, store
from service.tracking.queries import load_sweep
from service.training import Trainer

States = optuna.trial.TrialState
runner = CliRunner()
STEPS, EVAL_EVERY, CRASH_AT = 400, 50, 250


def _space(name: str, **overrides):
    return parse_space({
        "name": name, "steps": STEPS, "eval_every": EVAL_EVERY, "seeds": 4,
        "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
                  "train": {"batch_size": 32, "regularizer": {"shape": "linear", "lambda_max": 0.1, "t_start": 100,
                                                              "t_end": 300}}},
        "params": {
            "lr": {"type": "loguniform", "low": 1e-3, "high": 0.3, "target": "train.optimizer.lr"},
            "optimizer": {"type": "categorical", "choices": ["adam", "rmsprop"], "target": "train.optimizer.name"},
            "lambda_max": {"type": "loguniform", "low": 0.01, "high": 1.0, "target": "train.regularizer.lambda_max"},
        },
        "trials": 4, "concurrency": 2, "pack": 2, "scheduler": "none", **overrides,
    })


def _sweep(space, tmp_path: Path, **options):
    opts = driver.SweepOptions(name=space.name, tracking_uri=store.resolve_tracking_uri(None),
                               storage_path=str(tmp_path / "runs"), **options)
    summary = driver.run_sweep(space, opts, Console(file=io.StringIO()))
    client = store.client(opts.tracking_uri)
    children = runs.trial_runs(client, summary.experiment_id, summary.parent_run_id)
    return summary, client, children


def _alone_digest(space, child) -> str:
    """The final parameters' digest of the child's setting trained alone."""
    from service.search.assign import typed_params

    configs = run_configs(space, typed_params(space, child.data.params))
    return params_digest({name: Trainer(config).run() for name, config in configs.items()})


@pytest.mark.slow
def test_a_packed_sweep_records_each_member_as_its_own_trial(ray_address, tmp_path):
    space = _space("packed")
    summary, client, children = _sweep(space, tmp_path, optuna_storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert summary.outcome == "completed" and summary.trials["completed"] == 4, summary

    study = optuna.load_study(study_name="packed", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert [t.state for t in study.trials] == [States.COMPLETE] * 4
    assert len(children) == 4
    groups: dict[str, list] = {}
    for child in children:
        tags, params, metrics = child.data.tags, child.data.params, child.data.metrics
        groups.setdefault(tags[store.TAG_PACK_GROUP], []).append(child)
        assert tags[store.TAG_TRIAL_KEY] == f"{tags[store.TAG_PACK_GROUP]}.{tags[store.TAG_PACK_INDEX]}"
        assert child.info.status == "FINISHED" and tags[store.TAG_OUTCOME] == "completed"
        assert {"lr", "optimizer", "lambda_max", "task.kind", "seeds", "regularizer.lambda_max"} <= set(params)
        assert float(params["regularizer.lambda_max"]) == float(params["lambda_max"])
        trial = study.trials[int(tags[store.TAG_OPTUNA_TRIAL])]
        assert trial.params["lr"] == pytest.approx(float(params["lr"]))  # its own Optuna trial...
        assert trial.value == metrics["objective"]  # ...told its own objective
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "objective")]
        assert steps == list(range(0, STEPS + 1, EVAL_EVERY))
        assert metrics["n_seeds"] == 4
        assert tags[store.TAG_PARAMS_SHA256] == _alone_digest(space, child)  # bit-identical to alone
    assert sorted(len(g) for g in groups.values()) == [2, 2]
    for pair in groups.values():  # a pack shares every parameter but the continuous ones
        assert len({c.data.params["optimizer"] for c in pair}) == 1
        assert len({c.data.params["lr"] for c in pair}) == 2

    view = load_sweep(client, "packed")  # what status / best / report read: one row per member
    assert view.counts()["completed"] == 4 and len(view.ranked()) == 4
    status = runner.invoke(app, ["status", "packed"])
    assert status.exit_code == 0 and "4/4" in status.output, status.output
    member = "trial-" + children[0].data.tags[store.TAG_TRIAL_KEY]
    best = runner.invoke(app, ["best", "packed", "--trial", member, "--format", "yaml"])
    assert best.exit_code == 0 and f"best packed: {member}" in best.output, best.output


@pytest.mark.slow
def test_asha_prunes_one_member_of_a_pack_and_the_others_go_on(ray_address, tmp_path, sweep_checks):
    """One pack of 4 under ASHA with a grace period of 3 evaluations (η = 4, 8 reports:
    one rung, at report 3): the first member always passes it, a member below its cutoff
    stops there, and none stops before it (a grace period ignored would put rungs at
    reports 1 and 4)."""
    grace = 3 * EVAL_EVERY
    space = _space("packed-asha", pack=4, concurrency=1, scheduler={
        "type": "asha", "grace_period": grace, "reduction_factor": 4})
    summary, client, children = _sweep(space, tmp_path, optuna_storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    assert summary.outcome == "completed", summary
    outcomes = {int(c.data.tags[store.TAG_PACK_INDEX]): c for c in children}
    assert len(outcomes) == 4 and len({c.data.tags[store.TAG_PACK_GROUP] for c in children}) == 1
    assert outcomes[0].data.tags[store.TAG_OUTCOME] == "completed"
    pruned = [c for c in children if c.data.tags[store.TAG_OUTCOME] == "pruned"]
    completed = [c for c in children if c.data.tags[store.TAG_OUTCOME] == "completed"]
    assert pruned and completed and summary.trials["pruned"] == len(pruned), summary

    study = optuna.load_study(study_name="packed-asha", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    for child in children:
        trial = study.trials[int(child.data.tags[store.TAG_OPTUNA_TRIAL])]
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "objective")]
        if child in pruned:
            assert trial.state == States.PRUNED and child.info.status == "FINISHED"
            assert steps[-1] == grace and store.TAG_PARAMS_SHA256 not in child.data.tags  # at the rung
        else:
            assert trial.state == States.COMPLETE and steps[-1] == STEPS
            # its pack-mates stopping did not change one bit of its training
            assert child.data.tags[store.TAG_PARAMS_SHA256] == _alone_digest(space, child)
    sweep_checks.assert_study_agrees(space, client, children, study)  # with the reports each made


@pytest.mark.slow
def test_a_retried_pack_continues_every_member_from_its_checkpoint(ray_address, tmp_path, monkeypatch,
                                                                 crashing_trainable):
    space = _space("packed-retry", trials=2, concurrency=1, checkpoint_every=2)
    marker = tmp_path / "crashed"
    # the first attempt dies right after reporting step CRASH_AT; its last checkpoint is at 200
    monkeypatch.setattr(driver, "make_trainable", crashing_trainable(marker, CRASH_AT, "execute_pack"))
    summary, client, children = _sweep(space, tmp_path)
    assert marker.read_text() == str(float(CRASH_AT)), "the fault was not injected"
    assert summary.outcome == "completed" and summary.trials["completed"] == 2, summary
    assert len(children) == 2
    for child in children:
        tags = child.data.tags
        assert tags[store.TAG_ATTEMPTS] == "2" and tags[store.TAG_OUTCOME] == "completed"
        assert tags[store.TAG_RESUMED_FROM] == "200" and store.TAG_ERROR in tags
        history = client.get_metric_history(child.info.run_id, "objective")
        assert sorted(m.step for m in history) == list(range(0, STEPS + 1, EVAL_EVERY))  # each once
        assert tags[store.TAG_PARAMS_SHA256] == _alone_digest(space, child)
    # every checkpoint kept (issue 34): the first attempt's at 100 and 200, the retry's at 300
    checkpoints = list((tmp_path / "runs" / "packed-retry").glob("trial-*/checkpoint_*/member-1/trial_state.pt"))
    assert len(checkpoints) == 3, checkpoints


@pytest.mark.slow
def test_a_packed_sweep_resumes_after_the_driver_is_killed(ray_address, tmp_path, driver_killed_when,
                                                           sweep_checks):
    """SIGKILL the driver mid-sweep, then ``--resume``: exactly the planned members, each
    once in MLflow, nothing left RUNNING or FAIL, and the Optuna study agrees, member by member (the searcher's packs and
    the rung board come back with Tune's state)."""
    import yaml

    space_file = tmp_path / "packed.yaml"
    space = _space("packed-resume", trials=6, concurrency=1, scheduler={
        "type": "asha", "grace_period": 2 * EVAL_EVERY, "reduction_factor": 2})
    space_file.write_text(yaml.safe_dump(space.model_dump(mode="json")))
    study_url = f"sqlite:///{tmp_path / 'optuna.db'}"
    args = ["sweep", str(space_file), "--optuna-storage", study_url]
    client = store.client(store.resolve_tracking_uri(None))

    def finished() -> int:  # the parent run finishes last
        experiment = client.get_experiment_by_name("packed-resume")
        if experiment is None:
            return 0
        return len(client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'"))

    driver_killed_when(args, tmp_path, ray_address, lambda: finished() >= 2)
    assert finished() < 6, "the sweep finished before it could be killed"

    result = runner.invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    experiment = client.get_experiment_by_name("packed-resume")
    parent = runs.find_sweep_run(client, experiment.experiment_id, "packed-resume")
    children = runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)
    # exactly the plan, whenever the kill lands: a pack the killed driver started after Tune's
    # last snapshot has its unfinished members run again (same setting, Optuna trial and run)
    # and its finished ones kept; a member that finished after the snapshot, in a pack Tune
    # restores as running, keeps its result (its pack does not train it again); a member the
    # killed driver told Optuna was pruned, whose worker had not closed its run yet, keeps
    # its run, closed as pruned (service.sweep.study_sync)
    keys = [c.data.tags[store.TAG_TRIAL_KEY] for c in children]
    assert len(keys) == len(set(keys)) == 6, keys  # no member twice, none missing
    assert all(c.info.status == "FINISHED" and c.data.tags[store.TAG_OUTCOME] in ("completed", "pruned")
               for c in children)
    assert not client.search_runs([experiment.experiment_id], "attributes.status = 'RUNNING'")
    study = optuna.load_study(study_name="packed-resume", storage=study_url)
    assert all(t.state in (States.COMPLETE, States.PRUNED) for t in study.trials), study.trials
    for child in children:
        trial = study.trials[int(child.data.tags[store.TAG_OPTUNA_TRIAL])]
        expected = States.COMPLETE if child.data.tags[store.TAG_OUTCOME] == "completed" else States.PRUNED
        assert trial.state == expected and trial.params["lr"] == pytest.approx(float(child.data.params["lr"]))
        if expected == States.COMPLETE:
            assert trial.value == child.data.metrics["objective"]
    # member by member: the Optuna trials are exactly the finished MLflow runs
    numbers = [int(c.data.tags[store.TAG_OPTUNA_TRIAL]) for c in children]
    assert sorted(numbers) == [t.number for t in study.trials] == list(range(6))
    sweep_checks.assert_study_agrees(space, client, children, study)  # with the reports each made
