"""A sweep optimises the right way, and its Optuna study says what the sweep did (real Ray,
Optuna, MLflow and torch, at a tiny size; slow).

The space is a grid of four learning rates for one NAU learning ``x1 + x2`` in 200 steps:
Adam at 0.1 solves every seed within the first evaluation, the three smaller rates solve
none in that budget (hopeless). So ASHA, maximising the objective, must stop every hopeless
trial that reaches a rung after the solving one (with η = 4 the cutoff there lies between
the solving value and the hopeless ones), the CLI must rank the solving setting first, and
the study must maximise, hold each trial as the sweep ended it (PRUNED with the reports it
made, or COMPLETE) and have the CLI's best as its best trial.
"""

from __future__ import annotations


import optuna
import pytest
from typer.testing import CliRunner

from service.cli import app
from service.scoring.objective import OBJECTIVE
from service.search.loading import parse_space
from service.tracking import store
from service.tracking.queries import load_sweep

States = optuna.trial.TrialState
SOLVING, HOPELESS = 0.1, (1e-4, 1e-3, 1e-2)
STEPS, EVAL_EVERY = 200, 25


def _space(name: str, **overrides):
    return parse_space({
        "name": name, "steps": STEPS, "eval_every": EVAL_EVERY, "seeds": 4,
        "task": {"kind": "single_unit", "operation": "add", "eval_samples": 200, "threshold_samples": 10_000},
        "fixed": {"model": {"layers": [{"unit": "nau"}]}, "device": "cpu", "compile": "off",
                  "train": {"batch_size": 32}},
        "params": {"lr": {"type": "categorical", "choices": [*HOPELESS, SOLVING], "target": "train.optimizer.lr"}},
        "trials": 4, "concurrency": 1, "sampler": {"type": "grid", "seed": 0},
        "scheduler": {"type": "asha", "grace_period": EVAL_EVERY, "reduction_factor": 4}, **overrides,
    })


@pytest.mark.slow
def test_asha_keeps_the_solving_setting_and_the_study_agrees_with_the_cli(ray_address, tmp_path, sweep_checks):
    check = sweep_checks
    space = _space("direction")
    summary, client, children, study = check.sweep_with_study(space, tmp_path)
    children.sort(key=check.optuna_number)  # the order the trials ran in (one at a time)
    lrs = [float(c.data.params["lr"]) for c in children]
    assert sorted(lrs) == sorted([*HOPELESS, SOLVING])  # the grid, each setting once
    outcomes = [c.data.tags[store.TAG_OUTCOME] for c in children]
    solver = lrs.index(SOLVING)

    # the CLI ranks the solving setting first: every seed solved
    best = load_sweep(client, space.name).ranked()[0]  # what `best` shows
    assert float(best.params["lr"]) == SOLVING and best.metrics["success_rate"] == 1.0
    shown = CliRunner().invoke(app, ["best", space.name, "--format", "yaml"])
    assert shown.exit_code == 0 and f"best {space.name}: {best.name}" in shown.output, shown.output
    assert outcomes[solver] == "completed"
    # ASHA stopped every hopeless trial that reached a rung after the solving one...
    assert outcomes[solver + 1:] == ["pruned"] * (len(children) - solver - 1)
    # ...and exactly the trials its rule (maximising) stops: the outcomes follow from the histories
    histories = [check.objective_reports(space, client, c) for c in children]
    assert [o == "completed" for o in outcomes] == check.asha_replay(space, histories)
    assert summary.trials["pruned"] == outcomes.count("pruned") >= 1

    # the study maximises, says what the sweep did, and its best is the CLI's
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert len(study.trials) == len(children)
    check.assert_study_agrees(space, client, children, study)
    assert study.best_trial.number == check.optuna_number(client.get_run(best.run_id))
    assert study.best_value == best.metrics[OBJECTIVE] == summary.best_objective
