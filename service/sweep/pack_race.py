"""A pack of racing settings (``scheduler: race`` with ``pack: K``): block r of every
member trained as one computation, each member still its own setting in the race.

As a lone racing trial (`service.sweep.race_trial`) does for one setting, block after
block: block r is the same seed ids for every member (so the race pairs them seed by seed,
packed or not), and after it each member's run gets its metrics on all its seeds so far
(one point per block), its seeds tag and per-seed table. Then the sweep's race board
(`service.sweep.race_board`) decides, member by member in pack order, who goes on: a
member that leaves (eliminated, replaced, at the maximum) has its run closed as completed
and leaves the computation; the others train the next block together. With
``scheduler.grace_period`` the board also judges first blocks by steps at each evaluation,
as ASHA would: a member stopped there is dropped from the computation at once and its run
closed as pruned.

After each block the pack reports once to Tune, with a checkpoint (`PackRaceState`: each
member's seeds so far and whether it still races): a retried or resumed pack continues at
the next block, and a block interrupted half way is trained again from its start (the
board answers a repeated report as it did the first time; a run skips steps it has logged).
Like `run_pack`, this is independent of Ray: ``race`` is anything with the board's
``blocks`` and ``first_blocks`` (`RaceBoard` itself, in a test).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.engine import attach_on_gpu
from service.scoring.objective import OBJECTIVE
from service.search.space import SearchSpace
from service.sweep.pack import Member, report_index
from service.sweep.race_board import RACE_TAGS
from service.sweep.race_trial import (
    RACE_BLOCK,
    RACE_SEEDS,
    RaceState,
    add_block,
    block_configs,
    encode_outcomes,
    record_block,
)
from service.sweep.results import (
    DONE,
    MEMBERS,
    PRUNED,
    RUNNING,
    STATE,
    STEP,
    member_key,
)
from service.sweep.trial import TaskScores, TrialProgress
from service.tracking.store import TAG_DEVICE, Outcome
from service.training.checkpoint import CheckpointError
from service.training.packing import MemberEval, PackedTrainer
from service.training.trainer import resolve_device

FILE = "pack_race_state.json"


@dataclass(frozen=True)
class PackRaceState:
    """A racing pack's checkpoint after ``blocks`` blocks: each member's state (running,
    done: it left the race, pruned: stopped by steps) and each running member's seeds."""

    blocks: int
    states: list[str]
    members: list[RaceState | None]

    def save(self, directory: str | Path) -> Path:
        for i, member in enumerate(self.members):
            if member is not None:
                (Path(directory) / f"member-{i}").mkdir(parents=True, exist_ok=True)
                member.save(Path(directory) / f"member-{i}")
        path = Path(directory) / FILE
        path.write_text(json.dumps({"blocks": self.blocks, "states": self.states}))
        return path

    @classmethod
    def load(cls, directory: str | Path, configs: list[dict[str, Any]]) -> PackRaceState:
        """Read the state of a pack whose members' run configs are ``configs``; refused
        (`CheckpointError`) when it is not a racing pack's of as many members."""
        try:
            data = json.loads((Path(directory) / FILE).read_text())
            blocks, states = int(data["blocks"]), [str(s) for s in data["states"]]
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"not a racing pack's checkpoint ({type(e).__name__}: {e})") from None
        if len(states) != len(configs) or set(states) - {RUNNING, DONE, PRUNED}:
            raise CheckpointError(f"the racing pack's checkpoint does not fit this pack of {len(configs)} settings")
        try:
            members = [RaceState.load(Path(directory) / f"member-{i}", c) if s == RUNNING else None
                       for i, (s, c) in enumerate(zip(states, configs))]
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"a member's race state is unreadable ({type(e).__name__}: {e})") from None
        return cls(blocks, states, members)


def run_pack_race(
    members: list[Member],
    space: SearchSpace,
    report: Callable[[dict[str, Any]], None],
    race: Any,
    trial_id: str,
    *,
    resume: PackRaceState | None = None,
    report_checkpoint: Callable[[dict[str, Any], PackRaceState], None] | None = None,
) -> list[Member]:
    """Race the members block by block until each has left (see the module); a member is
    known to the race by its trial key (`member_key(trial_id, index)`)."""
    spec = space.scheduler.race()
    budgets = spec.budgets()
    tasks = list(members[0].configs)
    total_steps = space.steps * len(tasks)
    states: dict[int, RaceState] = {}
    for m in members:
        if resume is not None and m.state == RUNNING:  # else replayed: its run ended already
            m.state = resume.states[m.index]
        own = resume.members[m.index] if resume is not None else None
        states[m.index] = own or RaceState(0, {t: [] for t in tasks}, {t: [] for t in tasks})
    key = {m.index: member_key(trial_id, m.index) for m in members}
    closing: list[threading.Thread] = []
    standings: list[tuple[str, str, int]] = []
    reported: list[bool] = []

    def emit(out: dict[str, Any], state: PackRaceState | None = None) -> None:
        reported.append(True)
        if state is not None and report_checkpoint is not None:
            report_checkpoint(out, state)
        else:
            report(out)

    def close(m: Member, outcome: str) -> None:
        if m.tracker is not None:  # beside the training: closing waits for the tracking server
            closing.append(threading.Thread(target=m.tracker.close, args=(outcome,)))
            closing[-1].start()

    def result(step: int, blocks: dict[int, int]) -> dict[str, Any]:
        out: dict[str, Any] = {OBJECTIVE: max((m.metrics[OBJECTIVE] for m in members if m.metrics), default=0.0),
                               STEP: float(step), RACE_TAGS: json.dumps(standings)}
        for m in members:
            if m.metrics:
                done = states[m.index].blocks
                shown = {**m.metrics, STEP: float(m.step), STATE: m.state,
                         RACE_BLOCK: float(blocks.get(m.index, done)),
                         RACE_SEEDS: float(budgets[done - 1] if done else 0)}
                out.update({f"{MEMBERS}/{m.index}/{k}": v for k, v in shown.items()})
        return out

    start = resume.blocks if resume is not None else 0
    for block in range(start, len(budgets)):
        live = [m for m in members if m.state == RUNNING]
        if not live:
            break
        latest: dict[int, dict[str, Any]] = {m.index: {} for m in live}
        by_steps = space.scheduler.first_block_rungs and block == 0
        scores = {m.index: TaskScores(space, TrialProgress()) for m in live}
        for index, task in enumerate(tasks):
            training = [m for m in live if m.state == RUNNING]
            if not training:
                break
            trainer = PackedTrainer([block_configs(m.configs, spec, block)[task] for m in training],
                                    prepare=attach_on_gpu)
            if block == start and index == 0:  # where it trains: a GPU share Ray gave the pack is cuda:0
                device = str(resolve_device(training[0].configs[task].device))
                for m in training:
                    if m.tracker is not None:
                        m.tracker.set_tags({TAG_DEVICE: device})

            def on_eval(evals: list[MemberEval], training: list[Member] = training, trainer: PackedTrainer = trainer,
                        task: str = task, index: int = index) -> None:
                step = evals[0].report.step
                if step <= 0 or step >= evals[0].report.total_steps:
                    return  # a first block's end is its block report
                values = {}
                for ev in evals:
                    m = training[ev.index]
                    m.metrics = scores[m.index].partial(task, ev.aggregate, ev.thresholds)
                    m.step = index * space.steps + step
                    if m.tracker is not None:
                        m.tracker.log_metrics(m.metrics, 0)  # the first block, in progress
                    values[key[m.index]] = m.metrics[OBJECTIVE]
                stopped, told = race.first_blocks(report_index(space, index, step), values)
                standings[:] = told
                for ev in evals:
                    m = training[ev.index]
                    if key[m.index] in stopped:
                        m.state = PRUNED
                        trainer.drop([ev.index])
                        close(m, Outcome.PRUNED)
                emit(result(index * space.steps + step, {m.index: 0 for m in training}))

            results = trainer.run(on_eval if by_steps else None)
            for m, r in zip(training, results, strict=True):
                if r is not None and m.state == RUNNING:
                    add_block(states[m.index], task, r)
                    latest[m.index][task] = r
                    scores[m.index].finish_task(task, r)
        reports = {}
        for m in live:
            if m.state != RUNNING:
                continue
            state = states[m.index]
            state.blocks = block + 1
            m.metrics = record_block(state, space, m.configs, m.tracker, latest[m.index], m.params)
            m.step = total_steps
            reports[key[m.index]] = (encode_outcomes(state.seeds, state.thresholds), budgets[block], state.blocks)
        stopped, told = race.blocks(reports) if reports else ([], [])
        standings[:] = told
        for m in live:
            if m.state == RUNNING and key[m.index] in stopped:
                m.state = DONE
                close(m, Outcome.COMPLETED)
        emit(result(total_steps, {}), PackRaceState(block + 1, [m.state for m in members],
                                                     [states[m.index] if m.state == RUNNING else None
                                                      for m in members]))
    if not reported and any(m.metrics for m in members):  # every member replayed: Tune gets their ends
        report(result(max(m.step for m in members), {}))
    for thread in closing:
        thread.join()
    return members
