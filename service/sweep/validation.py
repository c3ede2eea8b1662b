"""Re-validate a sweep's top settings on fresh seeds: ``nalu-sweep validate``.

The best trial of a search is optimistically biased: it won partly by the luck of its
seeds. Validation re-trains the top K settings with S seeds whose ids were never used by
the sweep (nor by an earlier validation), on every extrapolation range of the task plus
optional extra ranges, as Ray tasks; each setting becomes one child run of the sweep's
parent run, tagged ``nalu_sweep.role = validation``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from service.config import RunConfig
from service.errors import UserError, error_message
from service.scoring.combine import combine_tasks
from service.search.assign import active_params, run_configs, typed_params
from service.search.space import SearchSpace
from service.sweep import kill_points
from service.sweep.cluster import init_ray, stop_ray
from service.sweep.trial import log_trial_artifacts
from service.tracking import runs, store
from service.tracking.queries import sweep_space, validation_runs
from service.tracking.store import (
    ROLE_VALIDATION,
    TAG_BATCH,
    TAG_SEED_IDS,
    TAG_SOURCE_RUN,
    Outcome,
)


def trial_configs(space: SearchSpace, params: dict[str, str]) -> dict[str, RunConfig]:
    """``{task: RunConfig}`` of a logged trial, exactly as the sweep trained it."""
    return run_configs(space, typed_params(space, params))


def used_seed_ids(space: SearchSpace, trial_params: list[dict[str, str]], earlier: list[Any]) -> set[int]:
    """Every seed id the sweep trained (each trial's configs) or an earlier validation used."""
    used: set[int] = set()
    for params in trial_params:
        try:
            configs = trial_configs(space, params)
        except Exception:  # noqa: BLE001 - a trial we cannot rebuild: assume the space's seeds
            used.update(range(0, space.trial_seeds() + int(space.fixed.get("seed_offset", 0) or 0)))
            continue
        for config in configs.values():
            used.update(config.seed_ids)
            if "seeds" in params and params["seeds"].isdigit():  # the seed count the trial logged
                used.update(range(config.seed_offset, config.seed_offset + int(params["seeds"])))
    for run in earlier:
        text = run.data.tags.get(TAG_SEED_IDS, "")
        if "-" in text:
            lo, hi = text.split("-")
            used.update(range(int(lo), int(hi) + 1))
    return used


def fresh_offset(used: set[int]) -> int:
    return max(used) + 1 if used else 0


def validation_configs(space: SearchSpace, params: dict[str, str], seeds: int, seed_offset: int,
                       extra_ranges: dict[str, str]) -> dict[str, RunConfig]:
    """``{task: RunConfig}`` of a logged trial with fresh seeds and extra ranges added."""
    from service.search.targets import run_config_data

    values = active_params(space, typed_params(space, params))
    return {task: with_validation(run_config_data(space, values, task), seeds, seed_offset, extra_ranges)
            for task in space.task_configs()}


def with_validation(data: dict[str, Any], seeds: int, seed_offset: int,
                    extra_ranges: dict[str, str]) -> RunConfig:
    """A trial's run config (plain data) with fresh seeds and the extra extrapolation ranges."""
    import copy

    data = copy.deepcopy(data)
    data["seeds"] = seeds
    data["seed_offset"] = seed_offset
    if extra_ranges:
        task = data["task"]
        current = task.get("extrapolation") or {"extrapolation": "U[2,6]"}
        if not isinstance(current, dict):
            current = {"extrapolation": current}
        task["extrapolation"] = {**current, **extra_ranges}
    return RunConfig.model_validate(data)


def parse_ranges(items: list[str]) -> dict[str, str]:
    """``NAME=U[a,b]`` options → ``{NAME: "U[a,b]"}`` (checked by parsing a Range)."""
    from service.tasks.base import Range

    out: dict[str, str] = {}
    for item in items:
        name, sep, spec = item.partition("=")
        name, spec = name.strip(), spec.strip()
        if not sep or not name or not spec:
            raise UserError(f"--range {item!r}: expected NAME=RANGE, e.g. far=U[6,20]")
        try:
            Range.model_validate(spec)
        except ValidationError as e:
            why = "; ".join(error_message(err) for err in e.errors(include_url=False))
            raise UserError(f"--range {item!r}: {why}") from None
        out[name] = spec
    return out


# -- the Ray job -----------------------------------------------------------------------------------------
def _train_remote(configs: dict[str, Any], threads: int) -> dict[str, Any]:
    import torch

    from service.training import train

    torch.set_num_threads(max(1, threads))
    return {name: train(config) for name, config in configs.items()}


@dataclass
class ValidatedSetting:
    source_run_id: str
    source_name: str
    run_id: str
    search_metrics: dict[str, float]
    metrics: dict[str, float]
    seed_ids: list[int] = field(default_factory=list)


def validate_sweep(tracking_uri: str, name: str, top: int, seeds: int, extra_ranges: dict[str, str] | None = None,
                   address: str | None = None, include_pruned: bool = False,
                   say: Callable[[str], None] | None = None) -> list[ValidatedSetting]:
    """Re-train the sweep's ``top`` settings on ``seeds`` fresh seeds each (one Ray task per
    setting) and log one validation child run per setting under the sweep's parent run."""
    from service.scoring.objective import objective_value
    from service.tracking.queries import load_sweep

    extra_ranges = extra_ranges or {}
    client = store.client(tracking_uri)
    view = load_sweep(client, name)
    if view is None:
        raise UserError(f"no sweep named {name!r} in {tracking_uri}")
    ranked = view.ranked(include_pruned)[:top]
    if not ranked:
        raise UserError(f"sweep {name}: no finished trial to validate")
    space = sweep_space(client, view.run_id)
    earlier = validation_runs(client, view.experiment_id, view.run_id)
    used = used_seed_ids(space, [t.params for t in view.trials], earlier)
    offset = fresh_offset(used)
    fresh = set(range(offset, offset + seeds))
    assert not (fresh & used), "validation seeds overlap the search's seeds"

    jobs: list[tuple[Any, dict[str, RunConfig]]] = []
    for trial in ranked:
        configs = validation_configs(space, trial.params, seeds, offset, extra_ranges)
        for cfg in configs.values():
            assert not (set(cfg.seed_ids) & used), "validation seeds overlap the search's seeds"
        jobs.append((trial, configs))

    import ray

    already = ray.is_initialized()
    started_ray = init_ray(address, verbose=False, say=say)

    try:
        cpus = max(1, int(space.resources.cpus))
        remote = ray.remote(num_cpus=space.resources.cpus, num_gpus=space.resources.gpus)(_train_remote)
        refs = [remote.remote(configs, cpus)
                for _, configs in jobs]
        kill_points.reached("validation")
        results = ray.get(refs)
    finally:
        if started_ray or not already:  # stopped if started here, else disconnected (`run_sweep`)
            stop_ray()

    batch = str(len({r.data.tags.get(TAG_BATCH) for r in earlier}) + 1)
    out = []
    for (trial, configs), per_task in zip(jobs, results):
        finals = {task: (objective_value(r.aggregate, space.steps, r.thresholds), r.aggregate)
                  for task, r in per_task.items()}
        metrics = combine_tasks(finals)
        seed_ids = sorted(next(iter(configs.values())).seed_ids)
        run_id = _log_validation(client, view, trial, per_task, metrics, seed_ids, extra_ranges, batch)
        out.append(ValidatedSetting(trial.run_id, trial.name, run_id, dict(trial.metrics), metrics, seed_ids))
    return out


def _log_validation(client: Any, view: Any, trial: Any, results: dict[str, Any], metrics: dict[str, float],
                    seed_ids: list[int], extra_ranges: dict[str, str], batch: str) -> str:
    from mlflow.entities import Metric

    tags = {
        store.TAG_PARENT: view.run_id, store.TAG_ROLE: ROLE_VALIDATION, store.TAG_SWEEP: view.name,
        TAG_SOURCE_RUN: trial.run_id, TAG_SEED_IDS: f"{seed_ids[0]}-{seed_ids[-1]}", TAG_BATCH: batch,
        store.TAG_OUTCOME: Outcome.COMPLETED, store.TAG_DEVICE: next(iter(results.values())).device,
        "mlflow.note.content": (f"validation of {trial.name} ({trial.run_name or trial.name}) on fresh seeds "
                                f"{seed_ids[0]}..{seed_ids[-1]}: a re-run of that trial's setting, not a trial"),
    }
    run = store.retry(lambda: client.create_run(view.experiment_id, tags=tags,
                                                run_name=f"validate: {trial.run_name or trial.name}"))
    run_id = run.info.run_id
    params = {**trial.params, "validation.seeds": len(seed_ids), "validation.seed_offset": seed_ids[0],
              "validation.extra_ranges": json.dumps(extra_ranges) if extra_ranges else "(none)"}
    runs.log_params(client, run_id, params)
    batch_metrics = [Metric(k, float(v), 0, 0) for k, v in metrics.items() if math.isfinite(float(v))]
    store.retry(lambda: client.log_batch(run_id, metrics=batch_metrics[:900]))

    class _Tracker:
        def log_artifact_dir(self, directory: Path, artifact_path: str | None = None) -> None:
            store.retry(lambda: client.log_artifacts(run_id, str(directory), artifact_path))

    log_trial_artifacts(_Tracker(), results, {})
    store.retry(lambda: client.set_terminated(run_id, status="FINISHED"))
    return run_id
