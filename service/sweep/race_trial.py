"""A racing trial (``scheduler: race``): one setting trained block by block of seeds.

A race's budget is seeds (`service.scoring.race`): block r of every setting is the same
seed ids, the slice ``budgets[r-1] … budgets[r]-1`` of the trial's run config (whose
``seeds`` span the race's ``max_seeds``: `SearchSpace.trial_seeds`), so settings pair seed
by seed. A seed's outcome depends on its id alone (its own Philox streams), so a block
trained as one batch equals the same seeds inside one bigger batch.

After each block the trial logs to its MLflow run the metrics of all its seeds so far
(``n_seeds`` growing, one point per block at step = the block's number), its per-seed
table (``seeds.csv``, all seeds so far; the weights and curves of the latest block), and
reports once to Tune: the metrics, and the per-seed outcomes of all its seeds
(``RACE_OUTCOMES``) that the race scheduler (`service.sweep.race_scheduler`) decides on.
With ``scheduler.grace_period`` the first block also reports after each evaluation (no
outcomes, ``RACE_BLOCK`` 0, logged to the run at step 0), so the scheduler can stop it
early by steps, as ASHA would. Every block's report may be the last (the scheduler stops
the trial inside it), so everything is logged before it, and each report carries a
checkpoint (`RaceState`): a retried or resumed trial continues at the next block; a block
interrupted half way is trained again from its start.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.config import RunConfig
from service.formatting import fmt_interval, fmt_param
from service.scoring.combine import combine_tasks
from service.scoring.metrics import SeedMetrics, aggregate
from service.scoring.objective import objective_value
from service.scoring.race import Outcome, RaceSpec
from service.scoring.sequence import sequence_metrics
from service.search.space import SearchSpace
from service.sweep.results import STEP
from service.tracking.store import TAG_DEVICE, TAG_RACE_SEEDS

RACE_OUTCOMES = "race/outcomes"
"""Result key: all seeds' outcomes so far, JSON ``{task: [[success 0/1, loss or null], …]}``
in race order (position k is seed ``seed_offset + k`` in every setting)."""
RACE_SEEDS = "race/seeds"
"""Result key: the seeds (per task) the trial has trained."""
RACE_BLOCK = "race/block"
"""Result key: the blocks the trial has trained (1 after its first; 0 in a report from
inside its first block)."""
RACE_REPORT = "race/report"
"""Result key of a report from inside a first block (a race that stops first blocks by
steps: ``scheduler.grace_period``): its number as a lone trial's report would have it
(`service.sweep.pack.report_index`), which ASHA's rungs count (`SearchSpace.grace_reports`)."""
STATE_FILE = "race_state.json"


def block_configs(configs: dict[str, RunConfig], spec: RaceSpec, block: int) -> dict[str, RunConfig]:
    """Block ``block``'s run configs: the slice of each config's seeds that the block adds."""
    edges = (0, *spec.budgets())
    start, stop = edges[block], edges[block + 1]
    return {task: RunConfig.model_validate({**c.model_dump(mode="json"), "seeds": stop - start,
                                            "seed_offset": c.seed_offset + start})
            for task, c in configs.items()}


def seed_loss(seed: SeedMetrics, thresholds: dict[str, float]) -> float:
    """A seed's loss for the score test: log10 of its worst range's extrapolation error over
    the success threshold, 0 once solved (how far a failed seed was from solving); NaN
    (the worst) when undefined. The benchmark's ``error`` loss (benchmarks/racing.py)."""
    worst = -math.inf
    for name, threshold in thresholds.items():
        mse = seed.extrapolation_mse.get(name)
        if mse is None or not math.isfinite(mse) or not threshold > 0:
            return math.nan
        worst = max(worst, math.log10(max(mse, 1e-300) / threshold))
    return max(0.0, worst) if thresholds else math.nan


def encode_outcomes(seeds: dict[str, list[SeedMetrics]], thresholds: dict[str, dict[str, float]]) -> str:
    return json.dumps({task: [[int(s.success), None if math.isnan(loss := seed_loss(s, thresholds[task])) else loss]
                              for s in ss] for task, ss in seeds.items()}, separators=(",", ":"))


def decode_outcomes(text: str) -> dict[Any, Outcome]:
    """``{instance: Outcome}`` of a result's ``RACE_OUTCOMES``: the race position k for one
    task, ``(task, k)`` for several (a setting is as good as its worst task: `race.decide`)."""
    per_task = json.loads(text)
    out: dict[Any, Outcome] = {}
    for task, rows in per_task.items():
        for k, (ok, loss) in enumerate(rows):
            out[k if len(per_task) == 1 else (task, k)] = Outcome(bool(ok), math.nan if loss is None else float(loss))
    return out


@dataclass
class RaceState:
    """A racing trial after ``blocks`` blocks: every seed's metrics so far, per task."""

    blocks: int
    seeds: dict[str, list[SeedMetrics]]
    reinitialisations: dict[str, list[int]]
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / STATE_FILE
        path.write_text(json.dumps({
            "blocks": self.blocks, "thresholds": self.thresholds, "reinitialisations": self.reinitialisations,
            "seeds": {t: [s.model_dump(mode="json") for s in ss] for t, ss in self.seeds.items()}}))
        return path

    @classmethod
    def load(cls, directory: str | Path, configs: dict[str, RunConfig]) -> RaceState:
        data = json.loads((Path(directory) / STATE_FILE).read_text())
        if list(data["seeds"]) != list(configs):
            raise ValueError(f"the race checkpoint's tasks {list(data['seeds'])} are not this trial's {list(configs)}")
        return cls(int(data["blocks"]), {t: [SeedMetrics.model_validate(s) for s in ss] for t, ss in data["seeds"].items()},
                   {t: [int(r) for r in rs] for t, rs in data["reinitialisations"].items()}, data["thresholds"])


def run_race_trial(
    params: dict[str, Any],
    space: SearchSpace,
    report: Callable[[dict[str, Any]], None],
    configs: dict[str, RunConfig],
    tracker: Any = None,
    progress: Any = None,
    *,
    resume: RaceState | None = None,
    report_checkpoint: Callable[[dict[str, Any], RaceState], None] | None = None,
) -> None:
    """Train block after block until the scheduler stops the trial inside a report (or the
    last budget is reached); see the module docstring."""
    from service.engine import attach_on_gpu
    from service.training import Trainer

    spec = space.scheduler.race()
    budgets = spec.budgets()
    state = resume or RaceState(0, {t: [] for t in configs}, {t: [] for t in configs})
    total_steps = space.steps * len(configs)
    for block in range(state.blocks, len(budgets)):
        if progress is not None:
            progress.completed = False
        latest = {}
        rungs = _RungReports(space, report, tracker) if block == 0 and space.scheduler.first_block_rungs else None
        for index, (task, config) in enumerate(block_configs(configs, spec, block).items()):
            trainer = Trainer(config)
            attach_on_gpu(trainer)
            if tracker is not None and block == state.blocks and task == next(iter(configs)):
                tracker.set_tags({TAG_DEVICE: str(trainer.device)})
            result = trainer.run(rungs.on_eval(trainer, task, index) if rungs is not None else None)
            if rungs is not None:
                rungs.finished(task, result)
            add_block(state, task, result)
            latest[task] = result
        state.blocks = block + 1
        metrics = record_block(state, space, configs, tracker, latest, params)
        if progress is not None:  # a setting's result is complete at every block's end
            progress.final_metrics, progress.completed = dict(metrics), True
        out = {**metrics, STEP: float(total_steps), RACE_SEEDS: float(budgets[block]), RACE_BLOCK: float(state.blocks),
               RACE_OUTCOMES: encode_outcomes(state.seeds, state.thresholds)}
        if report_checkpoint is not None:
            report_checkpoint(out, state)
        else:
            report(out)


def record_block(state: RaceState, space: SearchSpace, configs: dict[str, RunConfig], tracker: Any,
                 latest: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A setting's metrics on all its seeds after block ``state.blocks`` (``latest``: that
    block's results per task), logged to its run (``tracker``, if any) at step = the block's
    number, with its seeds tagged and the block's artifacts; returns the metrics."""
    per_task = {t: (objective_value(agg := aggregate(ss), space.steps, state.thresholds[t]), agg)
                for t, ss in state.seeds.items()}
    metrics: dict[str, Any] = combine_tasks(per_task)
    metrics.update(sequence_metrics({t: (configs[t].task, ss) for t, ss in state.seeds.items()}))
    if tracker is not None:
        tracker.log_metrics(metrics, state.blocks)
        tracker.set_tags({TAG_RACE_SEEDS: str(space.scheduler.race().budgets()[state.blocks - 1])})
        _log_block(tracker, latest, state, params)
    return metrics


def add_block(state: RaceState, task: str, result: Any) -> None:
    """Append a block's result on ``task`` to the setting's seeds so far."""
    state.seeds[task].extend(result.seeds)
    state.reinitialisations[task].extend(list(result.reinitialisations) or [0] * len(result.seeds))
    state.thresholds[task] = dict(result.thresholds)


class _RungReports:
    """A first block's reports after each evaluation (``scheduler.grace_period``): the
    objective of its seeds so far, combined over the tasks the block has trained (as a
    trial's reports to ASHA, `service.sweep.trial`), for the scheduler to stop the block by
    steps; logged to the run at step 0 (the first block, in progress)."""

    def __init__(self, space: SearchSpace, report: Callable[[dict[str, Any]], None], tracker: Any) -> None:
        from service.sweep.trial import TaskScores, TrialProgress

        self.space, self.report, self.tracker = space, report, tracker
        self.scores = TaskScores(space, TrialProgress())

    def on_eval(self, trainer: Any, task: str, index: int) -> Callable[[Any], None]:
        from service.sweep.pack import report_index
        from service.sweep.trial import partial_aggregate

        def on_eval(rep: Any) -> None:
            if rep.step <= 0 or rep.step >= rep.total_steps:
                return  # the block's end is its block report
            metrics = self.scores.partial(task, partial_aggregate(trainer, rep), trainer.thresholds)
            if self.tracker is not None:
                self.tracker.log_metrics(metrics, 0)
            self.report({**metrics, STEP: float(index * self.space.steps + rep.step), RACE_BLOCK: 0.0,
                         RACE_REPORT: float(report_index(self.space, index, rep.step))})

        return on_eval

    def finished(self, task: str, result: Any) -> None:
        self.scores.finish_task(task, result)


def _log_block(tracker: Any, latest: dict[str, Any], state: RaceState, params: dict[str, Any]) -> None:
    """The latest block's artifacts (weights, curves), with ``seeds.csv`` holding every seed
    so far: the per-seed results appended block by block."""
    from service.tracking.artifacts import write_seed_table, write_trial_artifacts

    with tempfile.TemporaryDirectory(prefix="nalu-sweep-race-") as tmp:
        root = Path(tmp)
        for task, result in latest.items():
            directory = root / task if len(latest) > 1 else root
            seeds = state.seeds[task]
            a = aggregate(seeds)
            short = ", ".join(f"{k}={fmt_param(v)}" for k, v in params.items())
            title = f"{task}: success {a.successes}/{a.n_seeds} [{fmt_interval(a.success_ci_low, a.success_ci_high)}]  {short}"
            write_trial_artifacts(result, directory, title=title[:160])
            write_seed_table(dataclasses.replace(result, seeds=seeds, aggregate=a,
                                                 reinitialisations=state.reinitialisations[task]),
                             directory / "seeds.csv")
        tracker.log_artifact_dir(root)


def run_race(params: dict[str, Any], space: SearchSpace, configs: dict[str, RunConfig], checkpoint: Any,
             report: Callable[[dict[str, Any]], None], *, tracker: Any = None, progress: Any = None,
             report_checkpoint: Callable[[dict[str, Any], RaceState], None] | None = None) -> None:
    """`run_race_trial` from Tune's latest checkpoint of the trial (None: from block 0); a
    resumed trial's run is tagged with the blocks it resumes after."""
    from service.tracking.store import TAG_RESUMED_FROM

    resume = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            resume = RaceState.load(directory, configs)
        if tracker is not None:
            tracker.set_tags({TAG_RESUMED_FROM: str(resume.blocks)})  # its metrics are logged by block
    run_race_trial(params, space, report, configs, tracker, progress, resume=resume,
                   report_checkpoint=report_checkpoint)
