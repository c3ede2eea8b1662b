"""One trial: train a setting on every task of the space, report as it goes, log the end.

Independent of Ray: ``report`` is `ray.tune.report` inside a sweep, or any callable in
tests. Each evaluation after step 0 is reported with the objective of the partial
history, so ASHA can stop hopeless settings early. The last report of the trial happens
only after its final metrics and artifacts are logged, because ASHA stops a trial by
raising inside ``report`` (even at ``max_t``): code after it may never run.

Checkpoints: every ``space.checkpoint_every`` evaluations, and after each task but the
last, the report carries a `TrialState` (``report_checkpoint``; in a sweep, `tune.report`
with a Tune checkpoint), and ``resume`` continues from one, so a retried or resumed trial
does not start over.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from service.config import RunConfig
from service.engine import attach_on_gpu
from service.formatting import fmt_interval, fmt_param
from service.scoring.combine import combine_tasks
from service.scoring.metrics import AggregateMetrics, aggregate, per_seed_metrics
from service.scoring.objective import objective_value
from service.scoring.sequence import sequence_metrics
from service.search.assign import active_params, run_configs
from service.search.space import SearchSpace
from service.sweep.results import STEP
from service.sweep.trial_state import TrialState
from service.tracking.store import TAG_DEVICE, TAG_PARAMS_SHA256, Outcome
from service.training import EvalReport, Trainer
from service.training.result import RunResult


class Tracker(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact_dir(self, directory: Path, artifact_path: str | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def close(self, outcome: str) -> None: ...


@dataclass
class TrialProgress:
    """What the caller needs to close the trial correctly if ``report`` raises."""

    completed: bool = False
    reports: int = 0
    results: dict[str, RunResult] = field(default_factory=dict)
    final_metrics: dict[str, float] = field(default_factory=dict)


def partial_aggregate(trainer: Trainer, report: EvalReport) -> AggregateMetrics:
    """Aggregate metrics of the history so far (sparsity error at each seed's best step so
    far, and the current weights' as the final figure)."""
    try:
        final = trainer.model.sparsity_error().detach().cpu().numpy()
    except Exception:  # noqa: BLE001 - a tie-breaker only; never fail the trial for it
        final = np.full(trainer.num_seeds, np.nan)
    seeds = per_seed_metrics(report.history, trainer.thresholds, trainer.best_sparsity_error.cpu().numpy(),
                             report.diverged, None, trainer.seed_ids, final_sparsity_error=final,
                             prerequisites=trainer.task.range_prerequisites())
    return aggregate(seeds)


@dataclass
class TaskScores:
    """A trial's score so far, task by task: the objective and aggregate of each finished
    task (and of the task in progress, at an evaluation), combined as the worst task's."""

    space: SearchSpace
    progress: TrialProgress
    finals: dict[str, tuple[float, AggregateMetrics]] = field(default_factory=dict)

    @classmethod
    def start(cls, space: SearchSpace, progress: TrialProgress, resume: TrialState | None) -> TaskScores:
        scores = cls(space, progress)
        for name, result in (resume.finished if resume is not None else {}).items():
            progress.results[name] = result
            scores.finals[name] = (objective_value(result.aggregate, space.steps, result.thresholds), result.aggregate)
        return scores

    def partial(self, task: str, agg: AggregateMetrics, thresholds: dict[str, float]) -> dict[str, float]:
        """The metrics to report at an evaluation of ``task`` (``agg``: its history so far)."""
        return combine_tasks({**self.finals, task: (objective_value(agg, self.space.steps, thresholds), agg)})

    def finish_task(self, task: str, result: RunResult) -> dict[str, float]:
        """Record ``task``'s result; the trial's metrics after it."""
        self.progress.results[task] = result
        self.finals[task] = (objective_value(result.aggregate, self.space.steps, result.thresholds), result.aggregate)
        metrics = combine_tasks(self.finals)
        metrics.update(sequence_metrics({n: (r.config.task, r.seeds) for n, r in self.progress.results.items()}))
        return metrics


def finish_trial(tracker: Tracker | None, progress: TrialProgress, params: dict[str, Any],
                 metrics: dict[str, float], step: int) -> None:
    """Log a completed trial's final metrics, parameter digest and artifacts, and close its
    run (before its last report: the scheduler may stop the trial inside ``report``)."""
    progress.final_metrics = metrics
    if tracker is not None:
        tracker.log_metrics(metrics, step)
        tracker.set_tags({TAG_PARAMS_SHA256: params_digest(progress.results)})
        log_trial_artifacts(tracker, progress.results, params)
        tracker.close(Outcome.COMPLETED)
    progress.completed = True


def run_trial(
    params: dict[str, Any],
    space: SearchSpace,
    report: Callable[[dict[str, float]], None],
    tracker: Tracker | None = None,
    progress: TrialProgress | None = None,
    *,
    configs: dict[str, RunConfig] | None = None,
    resume: TrialState | None = None,
    report_checkpoint: Callable[[dict[str, float], TrialState], None] | None = None,
) -> TrialProgress:
    """Train the trial's setting on each task in turn (S seeds each), reporting after every
    evaluation; log per-task artifacts and final metrics, then make the last report.

    ``configs`` are the trial's run configs when the caller built them already (the driver
    does, once per trial). ``resume`` continues from a checkpoint (finished tasks are not trained again, the task
    in progress continues from its trainer's state). ``report_checkpoint`` is called
    instead of ``report`` when a checkpoint is due; without it no checkpoint is taken.
    """
    progress = progress or TrialProgress()
    params = active_params(space, params)
    configs = configs if configs is not None else run_configs(space, params)
    n_tasks = len(configs)
    scores = TaskScores.start(space, progress, resume)
    start = resume.task_index if resume is not None else 0
    checkpoint_every = space.checkpoint_every if report_checkpoint is not None else 0

    def emit(metrics: dict[str, float], step: int, to_tune: bool, state: TrialState | None = None) -> None:
        if tracker is not None:
            tracker.log_metrics(metrics, step)
        if to_tune:
            progress.reports += 1
            if state is not None and report_checkpoint is not None:
                report_checkpoint({**metrics, STEP: float(step)}, state)
            else:
                report({**metrics, STEP: float(step)})

    for index, (task_name, config) in enumerate(configs.items()):
        if index < start:
            continue
        trainer = Trainer(config)
        attach_on_gpu(trainer)  # on a GPU the device engine trains the runs it covers
        if tracker is not None and index == start:  # where it trains: a GPU share Ray gave it is cuda:0
            tracker.set_tags({TAG_DEVICE: str(trainer.device)})
        offset = index * space.steps

        def on_eval(rep: EvalReport, trainer: Trainer = trainer, name: str = task_name,
                    offset: int = offset, index: int = index) -> None:
            if rep.step >= rep.total_steps:
                return  # the final evaluation is reported from the full result below
            metrics = scores.partial(name, partial_aggregate(trainer, rep), trainer.thresholds)
            state = None
            if rep.checkpoint is not None:
                state = TrialState(index, offset + rep.step, dict(progress.results), rep.checkpoint)
            emit(metrics, offset + rep.step, to_tune=rep.step > 0, state=state)

        resume_from = resume.trainer if resume is not None and index == start else None
        result = trainer.run(on_eval, resume_from=resume_from, checkpoint_every=checkpoint_every)
        metrics = scores.finish_task(task_name, result)
        step = offset + space.steps
        if index < n_tasks - 1:
            state = TrialState(index + 1, step, dict(progress.results)) if checkpoint_every else None
            emit(metrics, step, to_tune=True, state=state)
            continue
        finish_trial(tracker, progress, params, metrics, step)
        progress.reports += 1
        report({**metrics, STEP: float(step)})
    return progress


def params_digest(results: dict[str, RunResult]) -> str:
    """The final parameters' digest of a trial: its task's, or with several tasks one digest
    over theirs (equal digests: bit-identical final parameters)."""
    if len(results) == 1:
        return next(iter(results.values())).params_sha256
    import hashlib

    text = ";".join(f"{name}={r.params_sha256}" for name, r in results.items())
    return hashlib.sha256(text.encode()).hexdigest()


def log_trial_artifacts(tracker: Tracker, results: dict[str, RunResult], params: dict[str, Any]) -> None:
    from service.tracking.artifacts import write_trial_artifacts

    with tempfile.TemporaryDirectory(prefix="nalu-sweep-") as tmp:
        root = Path(tmp)
        for name, result in results.items():
            directory = root / name if len(results) > 1 else root
            short = ", ".join(f"{k}={fmt_param(v)}" for k, v in params.items())
            a = result.aggregate
            title = (f"{name}: success {a.successes}/{a.n_seeds} "
                     f"[{fmt_interval(a.success_ci_low, a.success_ci_high)}]  {short}")
            write_trial_artifacts(result, directory, title=title[:160])
        tracker.log_artifact_dir(root)

