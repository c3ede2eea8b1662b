"""The race rule (service/scoring/race.py): who is eliminated, who gets more seeds, and how
often a setting as good as its opponent is eliminated."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from service.scoring.race import (
    BETTER,
    CONTINUE,
    WORSE,
    Outcome,
    RaceSpec,
    decide,
    replay,
    sign_test_p,
    signed_rank_p,
)


def _outcomes(successes: list[bool], losses: list[float] | None = None) -> dict[int, Outcome]:
    losses = losses if losses is not None else [0.0 if s else 1.0 for s in successes]
    return {k: Outcome(bool(s), float(x)) for k, (s, x) in enumerate(zip(successes, losses))}


@pytest.mark.parametrize("test", ["sign", "score"])
def test_zero_of_eight_against_eight_of_eight_is_eliminated(test):
    spec = RaceSpec(test=test)
    none, every = _outcomes([False] * 8), _outcomes([True] * 8)
    assert decide(none, every, spec) == WORSE
    assert decide(every, none, spec) == BETTER  # and the other way round, the incumbent is shown worse


@pytest.mark.parametrize("test", ["sign", "score"])
def test_equal_or_close_outcomes_continue(test):
    spec = RaceSpec(test=test)
    seven = _outcomes([True] * 7 + [False])
    assert decide(seven, seven, spec) == CONTINUE
    assert decide(seven, _outcomes([True] * 8), spec) == CONTINUE  # one discordant seed proves nothing
    assert decide(_outcomes([True] * 8), seven, spec) == CONTINUE


def test_the_incumbent_gets_more_seeds_on_a_tie_and_a_hopeless_setting_leaves_after_one_block():
    spec = RaceSpec(first_block=8, growth=2, max_seeds=64)
    good = [Outcome(True, 0.0)] * 64
    hopeless = [Outcome(False, 5.0)] * 64
    result = replay({"a": good, "b": list(good), "c": hopeless}, ["a", "b", "c"], list(range(64)), spec)
    assert result.pick == "a"  # an unbroken tie keeps the incumbent
    assert result.seeds == {"a": 64, "b": 64, "c": 8}  # the tie was extended to the maximum
    assert result.exits["b"].reason == "lost at max"
    assert (result.exits["c"].reason, result.exits["c"].seeds) == ("eliminated", 8)


def test_a_clearly_better_challenger_replaces_the_incumbent():
    spec = RaceSpec()
    result = replay({"bad": [Outcome(False, 3.0)] * 64, "good": [Outcome(True, 0.0)] * 64},
                    ["bad", "good"], list(range(64)), spec)
    assert result.pick == "good"
    assert result.exits["bad"].reason == "replaced"
    assert result.total_seeds == 16


def test_multi_task_instances_let_the_worst_task_decide():
    spec = RaceSpec()
    ones, zeros = [True] * 8, [False] * 8

    def tasks(a: list[bool], b: list[bool]) -> dict:
        return {**{("A", k): Outcome(s, 0.0 if s else 1.0) for k, s in enumerate(a)},
                **{("B", k): Outcome(s, 0.0 if s else 1.0) for k, s in enumerate(b)}}

    # good on A, hopeless on B, against an incumbent good on both: worse
    assert decide(tasks(ones, zeros), tasks(ones, ones), spec) == WORSE
    # each hopeless on one task: both as bad as their worst task, neither shown worse
    assert decide(tasks(zeros, ones), tasks(ones, zeros), spec) == CONTINUE


def _equal_rate_races(test: str, rate_a: float, rate_b: float, races: int, spec: RaceSpec,
                      rng: np.random.Generator) -> tuple[float, float]:
    """Fractions of two-setting races in which the challenger was eliminated and in which
    the incumbent was replaced by the test (not at the maximum by a point estimate)."""
    eliminated = replaced = 0
    for _ in range(races):
        rows = {}
        for name, rate in (("incumbent", rate_a), ("challenger", rate_b)):
            success = rng.random(spec.max_seeds) < rate
            # a continuous loss: 0 on success, else a positive error of the same law
            loss = np.where(success, 0.0, rng.exponential(1.0, spec.max_seeds))
            rows[name] = [Outcome(bool(s), float(x)) for s, x in zip(success, loss)]
        result = replay(rows, ["incumbent", "challenger"], list(range(spec.max_seeds)), spec)
        eliminated += result.exits["challenger"].reason == "eliminated"
        replaced += result.exits["incumbent"].reason == "replaced"
    return eliminated / races, replaced / races


@pytest.mark.parametrize("test", ["sign", "score"])
def test_equal_rates_are_eliminated_at_most_at_the_level_and_a_worse_rate_is_found(test):
    spec = RaceSpec(first_block=8, growth=2, max_seeds=64, alpha=0.05, test=test)
    rng = np.random.default_rng(20240605)
    for rate in (0.3, 0.6, 0.85):
        eliminated, replaced = _equal_rate_races(test, rate, rate, 400, spec, rng)
        assert eliminated <= spec.alpha, (rate, eliminated)
        assert replaced <= spec.alpha, (rate, replaced)
    # the same rule does eliminate a clearly worse challenger (a flipped test would keep it)
    eliminated, _ = _equal_rate_races(test, 0.9, 0.3, 100, spec, rng)
    assert eliminated >= 0.9


def test_exact_tests_agree_with_scipy():
    stats = pytest.importorskip("scipy.stats")  # scipy comes with scikit-learn, a dependency
    assert sign_test_p(0, 8) == pytest.approx(1 / 256)
    for wins, losses in ((3, 9), (5, 5), (0, 1), (7, 2)):
        expected = stats.binomtest(wins, wins + losses, alternative="less").pvalue
        assert sign_test_p(wins, losses) == pytest.approx(expected)
    rng = np.random.default_rng(3)
    for n in (5, 12, 30):
        d = rng.normal(0.4, 1.0, n)
        expected = stats.wilcoxon(d, alternative="greater", method="exact").pvalue
        assert signed_rank_p(d) == pytest.approx(expected)
    assert signed_rank_p([0.0, 0.0]) == 1.0


def test_budgets_and_a_spec_that_cannot_start():
    assert RaceSpec(first_block=8, growth=2, max_seeds=100).budgets() == (8, 16, 32, 64, 100)
    assert RaceSpec(first_block=8, max_seeds=64).level == pytest.approx(0.05 / 4)
    with pytest.raises(ValidationError, match="max_seeds"):
        RaceSpec(first_block=16, max_seeds=8)
