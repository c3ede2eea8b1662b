"""ASHA per member of a pack: Tune's asynchronous successive halving, one trial at a time.

Tune's `ASHAScheduler` decides for a Tune trial; with ``pack: K`` a Tune trial is a group
of K Optuna trials (`service.sweep.pack`), which ASHA must judge one by one: a member
below the cutoff stops, its pack-mates go on. So packed sweeps run Tune's FIFO scheduler
and apply ASHA's rule here, in `Rungs` (pure, unit-tested), kept for the whole sweep by a
small Ray actor (`RungBoard`, created by the driver's searcher and looked up by name in
the workers).

The rule is Tune's (`ray.tune.schedulers.async_hyperband`): rungs at ``grace · η^k``
reports (up to ``max_t``, every bracket offset by its index); at each report a member is
recorded at the highest rung it has reached and not yet been recorded at, and it goes on
iff its objective is ≥ the ``(1 − 1/η)`` quantile of the values recorded there before it
(always, when none were). Two additions make it safe to repeat: a member reporting again
at the iteration where it was recorded (a retried pack, continued from a checkpoint) gets
the decision it got then, and decisions can be replayed into a fresh board (`restore`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np

_NAME_PREFIX = "nalu_sweep_rungs:"


def cutoff(recorded: list[float], reduction_factor: float) -> float | None:
    """The value a member must reach at a rung where ``recorded`` are the values so far."""
    if not recorded:
        return None
    return float(np.nanpercentile(recorded, (1 - 1 / reduction_factor) * 100))


@dataclass(frozen=True)
class RungSpec:
    """What decides the rungs: ASHA's settings in reports (`SearchSpace.grace_reports`,
    `total_reports`), and the name of the sweep's board."""

    name: str
    grace: int
    max_t: int
    reduction_factor: float
    brackets: int = 1


class Rungs:
    """The rungs of every bracket and the values (and decisions) recorded at each."""

    def __init__(self, grace: int, max_t: int, reduction_factor: float, brackets: int = 1) -> None:
        self.rf = reduction_factor
        self.milestones: list[list[float]] = []  # per bracket, highest first
        for s in range(brackets):
            count = int(np.log(max_t / grace) / np.log(reduction_factor) - s + 1)  # Tune's own
            self.milestones.append([grace * reduction_factor ** (k + s) for k in reversed(range(count))])
        # (bracket, rung) -> member -> (value, iteration, kept)
        self.records: dict[tuple[int, int], dict[int | str, tuple[float, int, bool]]] = {}

    def bracket_of(self, member: int | str) -> int:
        """A member's bracket: drawn with Tune's weights (e^(rungs − most rungs)), seeded by
        the member (its Optuna trial number), so every worker and restart agrees."""
        sizes = [len(m) for m in self.milestones]
        weights = [math.exp(n - max(sizes)) for n in sizes]
        return random.Random(member).choices(range(len(sizes)), weights=weights)[0]

    def judge(self, member: int | str, iteration: int, value: float, kept: bool | None = None) -> bool:
        """Whether ``member`` (an Optuna trial number; a race's trial key) goes on after
        its report number ``iteration`` with objective ``value``; ``kept`` given: record
        that decision instead (a replay)."""
        bracket = self.bracket_of(member)
        for rung, milestone in enumerate(self.milestones[bracket]):
            if iteration < milestone:
                continue
            recorded = self.records.setdefault((bracket, rung), {})
            if member in recorded:
                _, at, decision = recorded[member]
                if at == iteration:
                    return decision
                continue
            if kept is None:
                limit = cutoff([v for v, _, _ in recorded.values()], self.rf)
                kept = limit is None or value >= limit
            recorded[member] = (value, iteration, kept)
            return kept
        return True


class RungBoard:
    """The sweep's `Rungs`, as a Ray actor (`board`) shared by every pack of the sweep."""

    def __init__(self, grace: int, max_t: int, reduction_factor: float, brackets: int = 1) -> None:
        self.rungs = Rungs(grace, max_t, reduction_factor, brackets)

    def judge(self, iteration: int, values: dict[int, float]) -> list[int]:
        """The members (Optuna trial numbers) of ``values`` that stop at this report."""
        return [member for member, value in values.items() if not self.rungs.judge(member, iteration, value)]

    def restore(self, records: list[tuple[int, int, float, bool]]) -> None:
        """Replay ``(member, iteration, value, kept)`` records, in order."""
        for member, iteration, value, kept in records:
            self.rungs.judge(member, iteration, value, kept)


_HANDLES: dict[str, object] = {}
"""The driver's handles of its boards: a Ray actor lives only while a handle to it does."""


def board(spec: RungSpec):
    """The sweep's board actor, created on first use (no CPU reserved: it only keeps lists)
    and held by this process until `release_board`."""
    import ray

    actor = ray.remote(RungBoard).options(name=_NAME_PREFIX + spec.name, get_if_exists=True, num_cpus=0)
    handle = _HANDLES[spec.name] = actor.remote(spec.grace, spec.max_t, spec.reduction_factor, spec.brackets)
    return handle


def release_board(name: str) -> None:
    """End the board of sweep ``name`` (when the sweep has ended), if this process holds it."""
    import ray

    handle = _HANDLES.pop(name, None)
    if handle is not None:
        ray.kill(handle)


def find_board(name: str):
    """The running board of sweep ``name`` (in a worker)."""
    import ray

    return ray.get_actor(_NAME_PREFIX + name)


class SweepGone(RuntimeError):
    """The sweep's board is not there, or died under a pack. The driver owns the board, and
    Ray ends an actor whose owner dies, so this happens when the driver was killed or the
    sweep has ended. It says nothing about the pack's settings: their runs are interrupted,
    not failed."""


def board_judge(name: str):
    """A pack's judge for ``(iteration, {member: value})``: the members to stop, as the board
    of sweep ``name`` decides. Raises `SweepGone` when the board is dead or not there."""
    import ray
    from ray.exceptions import RayActorError

    try:
        rungs = find_board(name)
    except ValueError as e:  # Ray's answer when no actor has that name
        raise SweepGone(f"the rung board of sweep {name!r} is gone: {e}") from e

    def judge(iteration: int, values: dict[int, float]) -> list[int]:
        try:
            return ray.get(rungs.judge.remote(iteration, values))
        except RayActorError as e:
            raise SweepGone(f"the rung board of sweep {name!r} is gone: {e}") from e

    return judge
