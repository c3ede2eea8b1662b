"""ASHA per member of a pack (`service.sweep.rungs`): Tune's rule, decision for decision."""

from __future__ import annotations

import random

import pytest
from ray.tune.schedulers.async_hyperband import _Bracket
from ray.tune.schedulers.trial_scheduler import TrialScheduler

from service.sweep.rungs import (
    Rungs,
    RungSpec,
    SweepGone,
    board,
    board_judge,
    cutoff,
    release_board,
)


class _Trial:
    def __init__(self, trial_id: int) -> None:
        self.trial_id = trial_id


def test_a_member_goes_on_iff_it_reaches_the_quantile_of_its_rung():
    rungs = Rungs(grace=1, max_t=4, reduction_factor=2)  # rungs at reports 1, 2, 4
    assert rungs.judge(0, 1, 0.5)  # nothing recorded yet: it goes on
    assert not rungs.judge(1, 1, 0.4)  # below the median of [0.5]
    assert rungs.judge(2, 1, 0.5)  # ties go on
    assert rungs.judge(0, 2, 0.1)  # first at rung 2
    assert rungs.judge(0, 3, 0.0)  # between rungs: nothing to decide
    assert rungs.judge(2, 2, 0.2) and not rungs.judge(3, 1, 0.45)
    assert cutoff([0.5, 0.4, 0.5], 2) == 0.5 and cutoff([], 2) is None


def test_a_repeated_report_gets_the_decision_it_got_then():
    """A retried pack reports again from its checkpoint: the board must not judge anew."""
    rungs = Rungs(grace=1, max_t=4, reduction_factor=2)
    rungs.judge(0, 1, 0.9)
    assert not rungs.judge(1, 1, 0.1)
    rungs.judge(2, 1, 0.05)
    assert not rungs.judge(1, 1, 0.99)  # the same report again: still stopped
    assert rungs.judge(0, 1, 0.0)


def test_replayed_records_rebuild_the_rungs():
    live = Rungs(grace=1, max_t=8, reduction_factor=2)
    records = []
    for member, value in enumerate([0.3, 0.1, 0.7, 0.2]):
        for iteration in (1, 2):
            kept = live.judge(member, iteration, value)
            records.append((member, iteration, value, kept))
            if not kept:
                break
    restored = Rungs(grace=1, max_t=8, reduction_factor=2)
    for record in records:
        restored.judge(*record)
    assert restored.records == live.records
    assert restored.judge(9, 1, 0.25) == live.judge(9, 1, 0.25)


@pytest.mark.parametrize("grace,max_t,rf,brackets", [(1, 16, 2, 1), (2, 9, 3, 1), (1, 8, 4, 1), (3, 40, 2.5, 1),
                                                     (1, 27, 3, 3)])
def test_the_rule_is_tunes_async_hyperband(grace, max_t, rf, brackets):
    """Members reporting in an interleaved order (as packs do) get exactly the decisions
    Tune's own `_Bracket` gives trials reporting in that order."""
    rng = random.Random(f"{grace}-{max_t}-{rf}")
    rungs = Rungs(grace, max_t, rf, brackets)
    tune = [_Bracket(grace, max_t, rf, s) for s in range(brackets)]
    members = list(range(40))
    iteration = dict.fromkeys(members, 0)
    stopped: set[int] = set()
    while len(stopped) + sum(iteration[m] >= max_t for m in members) < len(members):
        member = rng.choice([m for m in members if m not in stopped and iteration[m] < max_t])
        iteration[member] += 1
        value = rng.choice([rng.random(), 0.0, 0.5])  # ties too
        ours = rungs.judge(member, iteration[member], value)
        theirs = tune[rungs.bracket_of(member)].on_result(_Trial(member), iteration[member], value)
        assert ours == (theirs == TrialScheduler.CONTINUE), (member, iteration[member], value)
        if not ours:
            stopped.add(member)
    assert 0 < len(stopped) < len(members)


def test_a_pack_judged_by_a_dead_board_learns_that_the_sweep_is_gone(ray_address):
    """The board is the driver's actor, and Ray ends an actor whose owner dies: a pack whose
    board is gone learns that its sweep is gone (`SweepGone`, which closes its members'
    runs as interrupted) rather than failing as if its settings had (a killed driver's
    pack did, before a resume; tests/sweep/test_pack_sweep.py)."""
    spec = RungSpec(name="gone-board", grace=1, max_t=4, reduction_factor=2)
    board(spec)
    judge = board_judge(spec.name)
    assert judge(1, {0: 0.5, 1: 0.4}) == [1]  # a working board: member 1 stops at rung 1
    release_board(spec.name)  # what Ray does to it when its owner dies
    with pytest.raises(SweepGone, match="rung board of sweep 'gone-board' is gone"):
        judge(2, {0: 0.5})
    with pytest.raises(SweepGone, match="is gone"):  # a pack started after the board ended
        board_judge(spec.name)
