"""Racing: a setting's budget is seeds, spent where they decide (irace's F-race, SMAC's
intensification).

A sweep that gives every setting the same S seeds spends as much on a hopeless setting as
on the winner. In a race a setting starts with a first block of seeds and gets more
(B, then ×growth, up to a maximum) only while it cannot be shown worse than the incumbent
on the seeds both have; when a challenger ties the incumbent the incumbent gets more seeds
too, so the winner is the setting with the most evidence.

The instance is a seed: seed k has the same data and initial weights in every setting, so
two settings are compared PAIRED, instance by instance, on the instances they share. An
instance id is any hashable: a seed id, or ``(task, seed)`` in a multi-task space, where
the challenger's worst task decides (`decide`).

Two paired tests, both exact and one-sided, at level ``alpha / looks`` per comparison
(Bonferroni over the ``looks`` budgets a setting passes through, so that over its whole
race a setting as good as its opponent is eliminated with probability at most ``alpha``):

* ``sign`` — on per-instance success: the discordant instances (one succeeded, the other
  did not) split 50/50 under the null; the challenger is worse when it won too few of them
  (the exact binomial tail, McNemar's exact test).
* ``score`` — on a per-instance loss (lower is better; NaN is the worst): Wilcoxon's
  signed rank on the paired differences, with the exact permutation distribution of the
  observed (mid)ranks, so ties and zeros are handled exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Literal, Mapping, NamedTuple, Sequence

import numpy as np
from pydantic import Field, model_validator

from service.frozen import Frozen
from service.scoring.metrics import wilson_interval

Instance = Hashable
WORSE, BETTER, CONTINUE = "worse", "better", "continue"


class Outcome(NamedTuple):
    """One setting on one instance: did it succeed, and its loss (lower is better)."""

    success: bool
    loss: float = math.nan


class RaceSpec(Frozen):
    """How seeds are given: budgets ``first_block``, ×``growth`` … up to ``max_seeds``."""

    first_block: int = Field(8, ge=1, le=4096)
    growth: int = Field(2, ge=2, le=16)
    max_seeds: int = Field(64, ge=1, le=65536)
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    test: Literal["sign", "score"] = "sign"

    @model_validator(mode="after")
    def _max_not_below_first(self) -> RaceSpec:
        if self.max_seeds < self.first_block:
            raise ValueError(f"max_seeds ({self.max_seeds}) must be at least first_block ({self.first_block})")
        return self

    def budgets(self) -> tuple[int, ...]:
        """The seed counts a setting passes through: B, B·g, B·g², … capped at the max."""
        out = [self.first_block]
        while out[-1] < self.max_seeds:
            out.append(min(self.max_seeds, out[-1] * self.growth))
        return tuple(out)

    def next_budget(self, seeds: int) -> int | None:
        """The budget after ``seeds``; None at the maximum."""
        return next((b for b in self.budgets() if b > seeds), None)

    @property
    def level(self) -> float:
        """The level of one comparison: ``alpha`` shared over the looks (Bonferroni)."""
        return self.alpha / len(self.budgets())


# -- the paired tests ---------------------------------------------------------------------------
def sign_test_p(challenger_only: int, incumbent_only: int) -> float:
    """One-sided exact p that the challenger is worse: ``P(X ≤ challenger_only)`` for
    ``X ~ Binomial(discordant, 1/2)``; 1 without discordant instances."""
    n = challenger_only + incumbent_only
    if n == 0:
        return 1.0
    return min(1.0, sum(math.comb(n, k) for k in range(challenger_only + 1)) / 2.0 ** n)


def _midranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def signed_rank_p(differences: Sequence[float]) -> float:
    """One-sided exact p that the challenger is worse, from ``challenger loss − incumbent
    loss`` per instance: the rank sum of the instances where the challenger was better is
    small. Zeros are dropped; ties get midranks, and the null distribution is that of those
    very ranks under random signs (the permutation distribution), so the test stays exact."""
    d = np.asarray(differences, dtype=np.float64)
    d = d[d != 0]
    if d.size == 0:
        return 1.0
    doubled = np.rint(2 * _midranks(np.abs(d))).astype(np.int64)  # midranks are halves
    observed = int(doubled[d < 0].sum())
    counts = np.zeros(int(doubled.sum()) + 1, dtype=np.float64)
    counts[0] = 1.0
    for r in doubled:  # the distribution of the sum of a random subset of the ranks
        counts[r:] += counts[:-r].copy()
    return float(min(1.0, counts[:observed + 1].sum() / counts.sum()))


def _losses(outcomes: Sequence[Outcome]) -> np.ndarray:
    loss = np.array([o.loss for o in outcomes], dtype=np.float64)
    return np.where(np.isnan(loss), np.inf, loss)


def paired_p(challenger: Sequence[Outcome], incumbent: Sequence[Outcome], test: str) -> float:
    """p that the challenger is worse than the incumbent, instance i against instance i."""
    if test == "sign":
        c = np.array([o.success for o in challenger], dtype=bool)
        i = np.array([o.success for o in incumbent], dtype=bool)
        return sign_test_p(int((c & ~i).sum()), int((i & ~c).sum()))
    a, b = _losses(challenger), _losses(incumbent)
    both_inf = np.isinf(a) & np.isinf(b)
    return signed_rank_p(np.where(both_inf, 0.0, a - np.where(both_inf, 0.0, b)))


# -- one comparison -----------------------------------------------------------------------------
def _task_and_seed(instance: Instance) -> tuple[Hashable, Hashable]:
    if isinstance(instance, tuple) and len(instance) == 2:
        return instance[0], instance[1]
    return None, instance


def _by_task(outcomes: Mapping[Instance, Outcome]) -> dict[Hashable, dict[Hashable, Outcome]]:
    tasks: dict[Hashable, dict[Hashable, Outcome]] = {}
    for instance, outcome in outcomes.items():
        task, seed = _task_and_seed(instance)
        tasks.setdefault(task, {})[seed] = outcome
    return tasks


def _worst_task(tasks: dict[Hashable, dict[Hashable, Outcome]]) -> Hashable:
    """The task with the lowest success rate (then the highest mean loss)."""
    def key(task: Hashable) -> tuple[float, float]:
        outs = list(tasks[task].values())
        losses = _losses(outs)
        mean_loss = float(np.mean(losses)) if np.isfinite(losses).all() else math.inf
        return sum(o.success for o in outs) / len(outs), -mean_loss
    return min(tasks, key=lambda t: (key(t), str(t)))


def _shown_worse(a: dict[Hashable, dict[Hashable, Outcome]], b: dict[Hashable, dict[Hashable, Outcome]],
                 spec: RaceSpec) -> bool:
    """``a``'s worst task is worse than every task of ``b`` (paired by seed id), each at
    the comparison's level: an intersection-union test, so its level is that level too."""
    worst = a[_worst_task(a)]
    for seeds in b.values():
        shared = sorted(set(worst) & set(seeds), key=repr)
        if not shared or paired_p([worst[s] for s in shared], [seeds[s] for s in shared], spec.test) > spec.level:
            return False
    return True


def decide(challenger: Mapping[Instance, Outcome], incumbent: Mapping[Instance, Outcome],
           spec: RaceSpec) -> str:
    """``worse`` (eliminate the challenger), ``better`` (the incumbent is shown worse) or
    ``continue``, on the instances both have. With ``(task, seed)`` instances a setting is
    as good as its worst task: the challenger is worse when its worst task is shown worse
    than each of the incumbent's tasks, seed by seed."""
    c, i = _by_task(challenger), _by_task(incumbent)
    if not c or not i:
        return CONTINUE
    if _shown_worse(c, i, spec):
        return WORSE
    if _shown_worse(i, c, spec):
        return BETTER
    return CONTINUE


def evidence(outcomes: Sequence[Outcome]) -> tuple[float, int, float]:
    """How a setting ranks at the end: the lower end of its 95% Wilson interval, then its
    successes, then its mean loss (lower first: negated). Higher is better."""
    successes = sum(o.success for o in outcomes)
    losses = _losses(outcomes)
    mean_loss = float(np.mean(losses)) if len(outcomes) and np.isfinite(losses).all() else math.inf
    return wilson_interval(successes, len(outcomes))[0], successes, -mean_loss


# -- a whole race, replayed ---------------------------------------------------------------------
@dataclass(frozen=True)
class Exit:
    """Where a setting left the race: its seeds then, and why."""

    seeds: int
    reason: Literal["pick", "eliminated", "replaced", "lost at max"]


@dataclass
class RaceResult:
    pick: str
    seeds: dict[str, int] = field(default_factory=dict)  # seeds each setting was trained on
    exits: dict[str, Exit] = field(default_factory=dict)

    @property
    def total_seeds(self) -> int:
        return sum(self.seeds.values())


def replay(outcomes: Mapping[str, Sequence[Outcome]], order: Sequence[str], window: Sequence[int],
           spec: RaceSpec) -> RaceResult:
    """Play a whole race on known outcomes: ``outcomes[c][k]`` is setting c on seed k, the
    race's j-th seed is seed ``window[j]``. Settings arrive in ``order`` (as a sampler
    would propose them), each with the first block; the first is the incumbent. A
    challenger gets its next block while it is not shown worse and has fewer seeds than the
    incumbent; when it has as many, the incumbent gets its next block (a tie extends the
    incumbent). A challenger shown better replaces the incumbent; when both reach the
    maximum undecided, the better `evidence` stays the incumbent (the incumbent on a tie)."""
    if len(window) < spec.max_seeds:
        raise ValueError(f"the window has {len(window)} seeds, the race may need {spec.max_seeds}")
    if not order:
        raise ValueError("a race needs at least one setting")
    played = {c: [outcomes[c][k] for k in window[:spec.max_seeds]] for c in order}
    result = RaceResult(pick=order[0])
    result.seeds[order[0]] = spec.first_block
    incumbent = order[0]

    def on(c: str, n: int) -> dict[int, Outcome]:
        return dict(enumerate(played[c][:n]))

    for challenger in order[1:]:
        result.seeds[challenger] = spec.first_block
        while True:
            n_c, n_i = result.seeds[challenger], result.seeds[incumbent]
            n = min(n_c, n_i)
            verdict = decide(on(challenger, n), on(incumbent, n), spec)
            if verdict == WORSE:
                result.exits[challenger] = Exit(n_c, "eliminated")
                break
            if verdict == BETTER:
                result.exits[incumbent] = Exit(n_i, "replaced")
                incumbent = challenger
                break
            if n_c < n_i:
                result.seeds[challenger] = spec.next_budget(n_c) or n_i
                continue
            grown = spec.next_budget(n_i)
            if grown is not None:
                result.seeds[incumbent] = grown
                continue
            if evidence(played[challenger][:n]) > evidence(played[incumbent][:n]):
                result.exits[incumbent] = Exit(n_i, "lost at max")
                incumbent = challenger
            else:
                result.exits[challenger] = Exit(n_c, "lost at max")
            break
    result.pick = incumbent
    result.exits[incumbent] = Exit(result.seeds[incumbent], "pick")
    return result
