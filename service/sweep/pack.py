"""A pack: up to K trials of a sweep trained as one seed-batched computation, each still
its own trial (``pack: K`` in the search space).

The members of a pack share their structure (`service.search.packing`: only continuous
settings differ), so `service.training.packing.PackedTrainer` trains all their seeds at
once, task by task. Everything else stays per member, as `service.sweep.trial.run_trial`
does it for a lone trial: its own `TaskScores`, its own MLflow run (``tracker``), its own
metrics at every evaluation, final metrics, parameter digest and artifacts, and its own
ASHA decision (``judge``, `service.sweep.rungs`): a member that is stopped is dropped from
the computation and its run closed as pruned, and the others go on, bit for bit as before.

Like `run_trial`, this is independent of Ray: ``report`` gets one result per evaluation
for the whole pack, with each member's metrics and state under `MEMBERS`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.config import RunConfig
from service.engine import attach_on_gpu
from service.scoring.objective import OBJECTIVE
from service.search.space import SearchSpace
from service.sweep.results import DONE, MEMBERS, PRUNED, RUNNING, STATE, STEP
from service.sweep.trial import TaskScores, Tracker, TrialProgress, finish_trial
from service.sweep.trial_state import TrialState
from service.tracking.store import TAG_DEVICE, Outcome
from service.training.checkpoint import (
    FORMAT,
    CheckpointError,
    load_payload,
    save_payload,
)
from service.training.packing import MemberEval, PackedTrainer
from service.training.trainer import resolve_device

FILE = "pack_state.pt"


def report_index(space: SearchSpace, task_index: int, step: int) -> int:
    """The number of the report made at evaluation ``step`` of task ``task_index`` (Tune's
    ``training_iteration`` of a lone trial: one report per evaluation after step 0)."""
    return task_index * space.reports_per_task() + math.ceil(step / space.eval_every)


@dataclass
class Member:
    """One trial of a pack."""

    index: int  # its place in the pack
    number: int  # its Optuna trial number (what the rung board knows it by)
    params: dict[str, Any]
    configs: dict[str, RunConfig]
    tracker: Tracker | None = None
    progress: TrialProgress = field(default_factory=TrialProgress)
    state: str = RUNNING
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PackState:
    """A pack's checkpoint: the task in progress, each member's state, and each running
    member's own `TrialState` (finished tasks, its trainer's checkpoint)."""

    task_index: int
    step: int
    states: list[str]
    members: list[TrialState | None]

    def save(self, directory: str | Path) -> Path:
        for i, member in enumerate(self.members):
            if member is not None:
                member.save(Path(directory) / f"member-{i}")
        payload = {"format": FORMAT, "task_index": self.task_index, "step": self.step, "states": list(self.states)}
        return save_payload(payload, Path(directory) / FILE)

    @classmethod
    def load(cls, directory: str | Path, configs: list[dict[str, RunConfig]]) -> PackState:
        """Read a pack's state for members whose tasks are ``configs``; refused
        (`CheckpointError`) if it is another pack's."""
        payload = load_payload(Path(directory) / FILE)
        try:
            states = [str(s) for s in payload["states"]]
            task_index, step = int(payload["task_index"]), int(payload["step"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"not a valid pack checkpoint ({type(e).__name__}: {e})") from None
        if payload.get("format") != FORMAT or len(states) != len(configs) or set(states) - {RUNNING, PRUNED}:
            raise CheckpointError(f"the pack checkpoint does not fit this pack of {len(configs)} trials")
        members = [TrialState.load(Path(directory) / f"member-{i}", c) if s == RUNNING else None
                   for i, (s, c) in enumerate(zip(states, configs))]
        return cls(task_index, step, states, members)


def run_pack(
    members: list[Member],
    space: SearchSpace,
    report: Callable[[dict[str, Any]], None],
    *,
    judge: Callable[[int, dict[int, float]], list[int]] | None = None,
    resume: PackState | None = None,
    report_checkpoint: Callable[[dict[str, Any], PackState], None] | None = None,
) -> list[Member]:
    """Train every member on each task in turn, as one computation per task; log each
    member as its own trial and report the pack after every evaluation (see the module).

    ``judge(report number, {member number: objective})`` returns the members that stop;
    ``resume`` continues from a `PackState`; ``report_checkpoint`` is called instead of
    ``report`` when a checkpoint is due (as in `run_trial`)."""
    checkpoint_every = space.checkpoint_every if report_checkpoint is not None else 0
    scores = []
    for m in members:
        own = resume.members[m.index] if resume is not None else None
        if resume is not None and m.state == RUNNING:  # else finished already (a replayed member)
            m.state = resume.states[m.index]
        scores.append(TaskScores.start(space, m.progress, own))
    trains = any(m.state == RUNNING for m in members)
    tasks = list(members[0].configs)
    start = resume.task_index if resume is not None else 0
    closing: list[threading.Thread] = []  # the runs of pruned members, being closed

    def result(step: int) -> dict[str, Any]:
        out: dict[str, Any] = {OBJECTIVE: max((m.metrics[OBJECTIVE] for m in members if m.metrics), default=0.0),
                               STEP: float(step)}
        for m in members:
            if m.metrics:
                shown = {**m.metrics, STEP: float(m.step), STATE: m.state}
                out.update({f"{MEMBERS}/{m.index}/{k}": v for k, v in shown.items()})
        return out

    def state_at(task_index: int, step: int, checkpoints: dict[int, Any]) -> PackState:
        own = [TrialState(task_index, step, dict(m.progress.results), checkpoints.get(m.index))
               if m.state == RUNNING else None for m in members]
        return PackState(task_index, step, [m.state for m in members], own)

    def emit(step: int, state: PackState | None) -> None:
        if state is not None and report_checkpoint is not None:
            report_checkpoint(result(step), state)
        else:
            report(result(step))

    for index, task in enumerate(tasks):
        live = [m for m in members if m.state == RUNNING]
        if index < start or not live:
            continue
        trainer = PackedTrainer([m.configs[task] for m in live], prepare=attach_on_gpu)
        if index == start:  # where it trains: a GPU share Ray gave the pack is cuda:0
            device = str(resolve_device(live[0].configs[task].device))
            for m in live:
                if m.tracker is not None:
                    m.tracker.set_tags({TAG_DEVICE: device})
        offset = index * space.steps

        def on_eval(evals: list[MemberEval], live: list[Member] = live, trainer: PackedTrainer = trainer,
                    task: str = task, index: int = index, offset: int = offset) -> None:
            step = evals[0].report.step
            if step >= evals[0].report.total_steps:
                return  # the final evaluation is reported from the full results below
            for ev in evals:
                m = live[ev.index]
                m.metrics, m.step = scores[m.index].partial(task, ev.aggregate, ev.thresholds), offset + step
                if m.tracker is not None:
                    m.tracker.log_metrics(m.metrics, m.step)
            if step == 0:
                return
            values = {live[ev.index].number: live[ev.index].metrics[OBJECTIVE] for ev in evals}
            stopped = set(judge(report_index(space, index, step), values)) if judge else set()
            for ev in evals:
                m = live[ev.index]
                if m.number in stopped:
                    m.state = PRUNED
                    trainer.drop([ev.index])
                    if m.tracker is not None:  # beside the training: closing waits for the server
                        closing.append(threading.Thread(target=m.tracker.close, args=(Outcome.PRUNED,)))
                        closing[-1].start()
            checkpoints = {live[ev.index].index: ev.report.checkpoint for ev in evals if ev.report.checkpoint}
            emit(offset + step, state_at(index, offset + step, checkpoints) if checkpoints else None)

        resume_from = None
        if resume is not None and index == start:
            resume_from = [resume.members[m.index].trainer for m in live]
        results = trainer.run(on_eval, resume_from=resume_from, checkpoint_every=checkpoint_every)
        step = offset + space.steps
        done = [(m, r) for m, r in zip(live, results, strict=True) if r is not None and m.state == RUNNING]
        for m, r in done:
            m.metrics, m.step = scores[m.index].finish_task(task, r), step
        if not done:
            continue
        if index < len(tasks) - 1:
            for m, _ in done:
                if m.tracker is not None:
                    m.tracker.log_metrics(m.metrics, step)
            emit(step, state_at(index + 1, step, {}) if checkpoint_every else None)
            continue
        for m, _ in done:
            finish_trial(m.tracker, m.progress, m.params, m.metrics, step)
            m.state = DONE
        report(result(step))
    if not trains and any(m.metrics for m in members):  # every member replayed: Tune gets their ends
        report(result(max(m.step for m in members)))
    for thread in closing:
        thread.join()
    return members
