"""The trial as Ray Tune runs it, inside a worker: open (or reopen) its MLflow run, resume
from its latest checkpoint, train, and close the run with the right outcome."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.formatting import settings_label
from service.search.assign import active_params, run_configs
from service.search.space import SearchSpace
from service.sweep.cluster import gpu_ids, node_ip
from service.sweep.searcher import RUN_CONFIGS
from service.sweep.trial import TrialProgress, regularizer_params, run_trial
from service.sweep.trial_state import TrialState
from service.tracking import runs, store
from service.tracking.store import Outcome

TRAINABLE_NAME = "nalu_sweep_trial"


@dataclass(frozen=True)
class TrialSettings:
    """Everything a trial needs besides its sampled parameters and run configs; plain data
    (pickled). ``space`` was checked by the driver; ``task_params`` are logged with every
    trial."""

    space: dict[str, Any]
    task_params: dict[str, Any]
    sweep: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    threads: int


def make_trainable(settings: TrialSettings):
    """The Tune function trainable (a closure over ``settings``, pickled by value)."""

    def nalu_sweep_trial(config: dict[str, Any]) -> None:
        execute_trial(config, settings)

    nalu_sweep_trial.__name__ = TRAINABLE_NAME
    return nalu_sweep_trial


def execute_trial(config: dict[str, Any], settings: TrialSettings) -> None:
    """Open (or reopen) the trial's MLflow run, train, and close the run with the right
    outcome whatever happens: ``completed``, ``pruned`` (ASHA raised inside a report
    before the end), or ``failed`` (an exception; Tune may retry, reusing the run).

    A retried or resumed trial gets its latest checkpoint from `tune.get_checkpoint` and
    continues from it (tagged ``nalu_sweep.resumed_from_step``); checkpoints are written to
    a temporary directory that `tune.report` copies to the sweep's storage."""
    import tempfile

    import torch
    from ray import tune

    context = tune.get_context()
    trial_id = context.get_trial_id()  # read first: stopping may interrupt anything later
    torch.set_num_threads(settings.threads)
    space = SearchSpace.model_validate(settings.space)  # checked in full by the driver
    params = active_params(space, {k: v for k, v in config.items() if k in space.params})
    configs = config.get(RUN_CONFIGS)
    if configs is None:  # the driver could not build them: `run_trial` raises in the trial's own run
        try:
            configs = run_configs(space, params)
        except Exception:  # noqa: BLE001
            configs = None
    logged = {**params, **settings.task_params, **(regularizer_params(configs) if configs else {})}
    tracker = runs.TrialRun.open(
        settings.tracking_uri, settings.experiment_id, settings.parent_run_id,
        trial_key=trial_id, run_name=settings_label(params, list(space.params)), params=logged,
        tags={store.TAG_SWEEP: settings.sweep, store.TAG_NODE: node_ip(), store.TAG_GPU_IDS: gpu_ids()},
    )
    progress = TrialProgress()
    outcome = Outcome.FAILED

    def report(metrics: dict[str, float]) -> None:
        tune.report(metrics)

    def report_checkpoint(metrics: dict[str, float], state: TrialState) -> None:
        with tempfile.TemporaryDirectory(prefix="nalu-sweep-checkpoint-") as tmp:
            state.save(tmp)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))

    try:
        resume = None
        checkpoint = tune.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                resume = TrialState.load(directory, configs or run_configs(space, params))
            tracker.set_tags({store.TAG_RESUMED_FROM: str(resume.step)})
        run_trial(params, space, report, configs=configs, tracker=tracker, progress=progress,
                  resume=resume, report_checkpoint=report_checkpoint)
        outcome = Outcome.COMPLETED
    except SystemExit:  # Tune's way of stopping a trial from inside `tune.report`
        outcome = Outcome.COMPLETED if progress.completed else Outcome.PRUNED
        raise
    except Exception as e:
        tracker.set_tags({store.TAG_ERROR: f"{type(e).__name__}: {e}"[:5000]})
        raise
    finally:
        tracker.close(outcome)

