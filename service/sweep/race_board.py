"""The race of a packed sweep (``scheduler: race`` with ``pack: K``), as a Ray actor.

With packs a Tune trial trains the blocks of K settings as one computation
(`service.sweep.pack_race`), so the race cannot be Tune's scheduler, which decides for a
whole Tune trial: a pack asks this board after each block which of its members go on. The
board holds the sweep's `Race` (`service.sweep.race_scheduler`: the same rule, the same
race file beside Tune's experiment state, read back by a resumed sweep's new board before
its first decision), created by the driver's searcher and looked up by name in the
workers, as the rung board of packed ASHA is (`service.sweep.rungs`).

The board writes no MLflow tags itself: each answer carries the standings its decisions
set (``(trial key, standing, blocks)``: the reporting members', and an incumbent's that a
challenger replaced), which the pack reports to Tune and the driver's searcher tags on
the runs (`service.sweep.pack_search`). A repeated report (a pack continued from an older
checkpoint after a kill) gets the same decision and the same standings again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.scoring.race import RaceSpec
from service.sweep.race_scheduler import Race
from service.sweep.rungs import RungSpec, SweepGone

_NAME_PREFIX = "nalu_sweep_race:"
RACE_TAGS = "race/standings"
"""Key of a racing pack's result: JSON ``[[trial key, standing, blocks], …]``, the standings
the board set with the decisions behind that report, for the driver to tag."""
Standing = tuple[str, str, int]  # (trial key, standing or why it left, blocks)


@dataclass(frozen=True)
class RaceBoardSpec:
    """What the board is made of: the sweep's name, the race, its file, its first-block rungs."""

    name: str
    race: RaceSpec
    state_path: str
    rungs: RungSpec | None = None


class RaceBoard:
    """The sweep's `Race` (no MLflow client: the standings go back to the packs)."""

    def __init__(self, spec: RaceBoardSpec) -> None:
        self.race = Race(spec.race, None, spec.state_path, spec.rungs)

    def blocks(self, reports: dict[str, tuple[str, int, int]]) -> tuple[list[str], list[Standing]]:
        """``{trial key: (its outcomes as reported, seeds, blocks)}`` after a block, decided
        in the order given: the keys that stop, and the standings to tag."""
        stopped = [t for t, (encoded, seeds, blocks) in reports.items()
                   if self.race.block_report(t, encoded, seeds, blocks)]
        return stopped, self._standings(reports)

    def first_blocks(self, iteration: int, values: dict[str, float]) -> tuple[list[str], list[Standing]]:
        """``{trial key: objective}`` at report ``iteration`` inside first blocks (ASHA's rule
        by steps): the keys that stop, and the standings to tag."""
        stopped = [t for t, value in values.items() if self.race.first_block_report(t, iteration, value)]
        return stopped, self._standings(stopped)

    def _standings(self, keys: Any) -> list[Standing]:
        events, self.race.tag_events = self.race.tag_events, []
        told = {t for t, _, _ in events}
        for t in keys:
            if t not in told and (standing := self.race.standing(t)) is not None:
                events.append((t, *standing))
        return events


_HANDLES: dict[str, object] = {}
"""The driver's handles of its boards: a Ray actor lives only while a handle to it does."""


def race_board(spec: RaceBoardSpec):
    """The sweep's race board, created on first use on this (the driver's) node, where the
    race file's path is, with no CPU reserved; held by this process until `release_race_board`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(RaceBoard).options(name=_NAME_PREFIX + spec.name, get_if_exists=True, num_cpus=0,
                                          scheduling_strategy=here)
    handle = _HANDLES[spec.name] = actor.remote(spec)
    return handle


def release_race_board(name: str) -> None:
    """End the race board of sweep ``name`` (when the sweep has ended), if this process holds it."""
    import ray

    handle = _HANDLES.pop(name, None)
    if handle is not None:
        ray.kill(handle)


class BoardRace:
    """A pack's view of the race board of sweep ``name`` (in a worker): its calls raise
    `SweepGone` when the board is dead or not there (the driver died, or the sweep ended)."""

    def __init__(self, name: str) -> None:
        import ray

        self.name = name
        try:
            self.board = ray.get_actor(_NAME_PREFIX + name)
        except ValueError as e:  # Ray's answer when no actor has that name
            raise SweepGone(f"the race board of sweep {name!r} is gone: {e}") from e

    def _call(self, method: str, *args: Any) -> tuple[list[str], list[Standing]]:
        import ray
        from ray.exceptions import RayActorError

        try:
            stopped, standings = ray.get(getattr(self.board, method).remote(*args))
        except RayActorError as e:
            raise SweepGone(f"the race board of sweep {self.name!r} is gone: {e}") from e
        return list(stopped), [tuple(s) for s in standings]

    def blocks(self, reports: dict[str, tuple[str, int, int]]) -> tuple[list[str], list[Standing]]:
        return self._call("blocks", reports)

    def first_blocks(self, iteration: int, values: dict[str, float]) -> tuple[list[str], list[Standing]]:
        return self._call("first_blocks", iteration, values)
