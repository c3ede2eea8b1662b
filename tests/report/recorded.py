"""Sweeps and validations written straight into a real MLflow store, without training:
the records `nalu-sweep validate` and a sweep leave, with chosen seed counts, for tests of
what the report and the terminal make of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from service.scoring.metrics import wilson_interval
from service.search.loading import parse_space
from service.tracking import runs, store

SMOKE = Path(__file__).resolve().parents[2] / "search_spaces" / "smoke.yaml"


def rate_metrics(successes: int, n: int, **more: float) -> dict[str, float]:
    """The success metrics of ``successes`` of ``n`` seeds, as a trial or validation logs them."""
    low, high = wilson_interval(successes, n)
    return {"successes": successes, "n_seeds": n, "success_rate": successes / n, "success_ci_low": low,
            "success_ci_high": high, "objective": low, **more}


def record_sweep(uri: str, name: str, trials: list[tuple[str, dict[str, Any], dict[str, float]]]) -> list[str]:
    """A finished sweep of the smoke space with ``trials`` (outcome, params, metrics); their run ids."""
    client = store.client(uri)
    exp_id = store.ensure_experiment(client, name, uri)
    space = parse_space(yaml.safe_load(SMOKE.read_text()), source="smoke")
    parent = runs.start_sweep_run(client, exp_id, name, space_file=None,
                                  spec_json=json.dumps(space.model_dump(mode="json")), spec_hash="x",
                                  storage_path="/nowhere",
                                  params={"trials": len(trials), "searched": ", ".join(space.params)})
    ids = []
    for i, (outcome, params, metrics) in enumerate(trials):
        trial = runs.TrialRun.open(uri, exp_id, parent, trial_key=f"t{i}", run_name=f"trial-{i}",
                                   params=params, tags={store.TAG_SWEEP: name})
        trial.log_metrics(metrics, 1000)
        ids.append(trial.run_id)
        trial.close(outcome)
    runs.finish_sweep_run(client, parent, "completed")
    return ids


def record_validation(uri: str, name: str, trial_run_id: str, successes: int, n: int, first_seed: int,
                      batch: int = 1) -> str:
    """A finished validation run of trial ``trial_run_id`` on seeds ``first_seed`` … ``first_seed + n − 1``."""
    client = store.client(uri)
    exp = client.get_experiment_by_name(name)
    parent = runs.find_sweep_run(client, exp.experiment_id, name)
    tags = {store.TAG_PARENT: parent.info.run_id, store.TAG_ROLE: store.ROLE_VALIDATION, store.TAG_SWEEP: name,
            store.TAG_SOURCE_RUN: trial_run_id, store.TAG_SEED_IDS: f"{first_seed}-{first_seed + n - 1}",
            store.TAG_BATCH: str(batch), store.TAG_OUTCOME: "completed"}
    run = client.create_run(exp.experiment_id, tags=tags, run_name=f"validate: {trial_run_id[:6]}")
    for key, value in rate_metrics(successes, n).items():
        client.log_metric(run.info.run_id, key, float(value), step=0)
    client.set_terminated(run.info.run_id, status="FINISHED")
    return run.info.run_id
