"""The Wilson interval of a success rate, in plain Python: the read-only verbs (``status``,
``best``, ``compare``) pool validations with it without importing numpy; and the wider
interval of a setting picked as the best of several on the same seeds."""

from __future__ import annotations

import math
from statistics import NormalDist


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``successes / n``.

    ``(p + z²/2n ± z·√(p(1−p)/n + z²/4n²)) / (1 + z²/n)`` with ``z`` the normal quantile of
    ``(1 + confidence)/2``; ``n = 0`` gives the uninformative ``(0, 1)``.
    """
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must lie in [0, n={n}]")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def best_of_interval(successes: int, n: int, among: int, confidence: float = 0.95) -> tuple[float, float]:
    """The interval of a setting picked as the best of ``among`` on these very seeds: the
    Wilson interval at ``1 − (1 − confidence) / among`` (Bonferroni over the ``among``
    intervals, so that all of them, and so the picked one's, hold together at
    ``confidence``; for the best one Holm's first step is the same). ``among = 1`` is
    `wilson_interval` itself."""
    if among < 1:
        raise ValueError(f"among={among} must be at least 1")
    return wilson_interval(successes, n, 1 - (1 - confidence) / among)
