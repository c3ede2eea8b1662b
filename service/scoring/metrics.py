"""Metrics of docs/domain/metrics.md: per seed, then over seeds.

Pure functions on numpy (and torch for `sparsity_error`); no training code. NaN/inf from a
diverged seed never raise: a NaN MSE is never below a threshold and ranks as +inf when the
best step is chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Annotated, Any, Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, PlainSerializer

from service.scoring.intervals import wilson_interval  # named here too

if TYPE_CHECKING:
    import torch


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


JsonFloat = Annotated[float, PlainSerializer(_finite_or_none, when_used="json")]
"""A float that keeps NaN/inf in Python and becomes ``null`` in JSON (JSON has no NaN)."""


# -- intervals ----------------------------------------------------------------------------------
def _t_two_sided_mass(t: float, df: int) -> float:
    """``P(|T| ≤ t)`` for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3–4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    s = math.sin(theta)
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return (2 / math.pi) * (theta + s * total) if df > 1 else 2 * theta / math.pi
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def t_quantile(confidence: float, df: int) -> float:
    """The ``t`` with ``P(|T| ≤ t) = confidence`` (two-sided) for ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("df must be at least 1")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    if df > 1000:  # Cornish–Fisher expansion; error far below what an interval needs
        return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    lo, hi = 0.0, max(2 * z, 1.0)
    while _t_two_sided_mass(hi, df) < confidence:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        if _t_two_sided_mass(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95, floor: float | None = None
                  ) -> tuple[float | None, float | None, float | None]:
    """``(mean, low, high)``: ``mean ± t_{n−1}·s/√n``; ``None`` where undefined (n < 1 / n < 2).

    ``floor``: the least value the quantity can take (0 for a step count or a sparsity
    error). With few, spread values the t interval reaches below it (0.14 ± 1.4 from two
    seeds); its lower end is then the floor, since no mean can lie below it."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        return None, None, None
    mean = float(v.mean())
    if v.size < 2:
        return mean, None, None
    half = t_quantile(confidence, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    low = mean - half if floor is None else max(floor, mean - half)
    return mean, low, mean + half


def median_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95
                    ) -> tuple[float | None, float | None, float | None]:
    """``(median, low, high)`` with a distribution-free interval from order statistics.

    ``[x_(j), x_(n+1−j)]`` with the largest ``j`` such that
    ``P(x_(j) ≤ m ≤ x_(n+1−j)) = 1 − 2·P(Binomial(n, ½) ≤ j − 1) ≥ confidence``. With too few
    values for that coverage (n < 6 at 95%) the interval is the sample range.
    """
    v = np.sort(np.asarray(values, dtype=np.float64).ravel())
    n = v.size
    if n == 0:
        return None, None, None
    median = float(np.median(v))
    best, below, total = 1, 0, 2 ** n
    for j in range(1, (n + 1) // 2 + 1):
        below += math.comb(n, j - 1)  # 2^n · P(Binomial(n, ½) ≤ j − 1)
        if 1 - 2 * below / total < confidence:
            break
        best = j
    return median, float(v[best - 1]), float(v[n - best])


# -- per seed -----------------------------------------------------------------------------------
@dataclass
class EvalHistory:
    """MSE at every evaluation step: ``steps [E]``, ``interpolation_mse [E, S]``,
    ``extrapolation_mse {range name: [E, S]}`` (float64; NaN/inf for diverged seeds)."""

    steps: np.ndarray
    interpolation_mse: np.ndarray
    extrapolation_mse: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.steps = np.asarray(self.steps, dtype=np.int64).reshape(-1)
        self.interpolation_mse = np.asarray(self.interpolation_mse, dtype=np.float64)
        if self.interpolation_mse.ndim != 2 or self.interpolation_mse.shape[0] != self.steps.size:
            raise ValueError(
                f"interpolation_mse must be [E={self.steps.size}, S], got {self.interpolation_mse.shape}"
            )
        self.extrapolation_mse = {
            name: np.asarray(v, dtype=np.float64) for name, v in self.extrapolation_mse.items()
        }
        for name, v in self.extrapolation_mse.items():
            if v.shape != self.interpolation_mse.shape:
                raise ValueError(
                    f"extrapolation_mse[{name!r}] has shape {v.shape}, "
                    f"interpolation_mse {self.interpolation_mse.shape}"
                )

    @property
    def num_seeds(self) -> int:
        return self.interpolation_mse.shape[1]

    def seeds(self, rows: slice) -> "EvalHistory":
        """The history of the seeds ``rows`` (copies)."""
        return EvalHistory(self.steps.copy(), self.interpolation_mse[:, rows].copy(),
                           {n: v[:, rows].copy() for n, v in self.extrapolation_mse.items()})


class SeedMetrics(BaseModel):
    """One training seed's outcome (docs/domain/metrics.md); MSEs are taken at ``best_step``."""

    model_config = ConfigDict(frozen=True)

    seed: int
    success: bool
    success_per_range: dict[str, bool]
    best_step: int | None
    interpolation_mse: JsonFloat
    extrapolation_mse: dict[str, JsonFloat]
    solved_at: int | None
    solved_at_per_range: dict[str, int | None]
    sparsity_error: JsonFloat  # at ``best_step`` (the papers' figure)
    diverged: bool
    diverged_at: int | None = None
    final_sparsity_error: JsonFloat = math.nan  # of the final model


def _first_true(mask: np.ndarray) -> np.ndarray:
    """Index of the first True along axis 0 per column, −1 where none (``[E, S] → [S]``)."""
    if mask.shape[0] == 0:
        return np.full(mask.shape[1], -1, dtype=np.int64)
    first = mask.argmax(axis=0)
    return np.where(mask.any(axis=0), first, -1)


def _step_or_none(value: Any) -> int | None:
    if value is None:
        return None
    value = float(value)
    return int(value) if math.isfinite(value) and value >= 0 else None


def per_seed_metrics(
    history: EvalHistory,
    thresholds: dict[str, float],
    sparsity_error: Sequence[float] | np.ndarray,
    diverged: Sequence[bool] | np.ndarray,
    diverged_at: Sequence[int | None] | np.ndarray | None = None,
    seed_ids: Sequence[int] | None = None,
    final_sparsity_error: Sequence[float] | np.ndarray | None = None,
    prerequisites: Mapping[str, Sequence[str]] | None = None,
) -> list[SeedMetrics]:
    """Per-seed success, ``best_step``, ``solved_at`` and MSEs from an evaluation history.

    ``sparsity_error`` is each seed's value at its ``best_step`` (the trainer keeps it as it
    trains, `Trainer.best_sparsity_error`); ``final_sparsity_error`` the final model's
    (NaN when not given).

    * ``best_step``: the evaluation step with the lowest interpolation MSE (NaN ranks as
      +inf; the first on ties).
    * success (per range): the extrapolation MSE at ``best_step`` is below the range's
      threshold; a seed succeeds when every range does. A diverged seed fails whatever it
      reached before.
    * ``prerequisites`` (``{range: ranges it needs}``, `Task.range_prerequisites`): a range
      succeeds only where the ranges it needs are below their thresholds too (a recurrent
      task's length L needs its read-out and every shorter test length), so its success
      is the conjunction; a seed's success (every range) is the same either way.
    * ``solved_at``: the first evaluation step at which every range is below its threshold;
      ``None`` for a failed seed (likewise ``solved_at_per_range`` per range, with its
      prerequisites).
    * ``diverged_at``: a step, or ``None``/negative/NaN for a seed that did not diverge.
    """
    names = list(history.extrapolation_mse)
    missing = [n for n in names if n not in thresholds]
    if missing:
        raise ValueError(f"no success threshold for extrapolation range(s) {missing}")
    n_evals, n_seeds = history.interpolation_mse.shape
    sparsity = np.asarray(sparsity_error, dtype=np.float64).reshape(-1)
    final_sparsity = (np.full(n_seeds, np.nan) if final_sparsity_error is None
                      else np.asarray(final_sparsity_error, dtype=np.float64).reshape(-1))
    div = np.asarray(diverged, dtype=bool).reshape(-1)
    ids = list(range(n_seeds)) if seed_ids is None else [int(s) for s in seed_ids]
    at = [None] * n_seeds if diverged_at is None else list(np.asarray(diverged_at, dtype=object).reshape(-1))
    for label, arr in (("sparsity_error", sparsity), ("final_sparsity_error", final_sparsity), ("diverged", div),
                       ("seed_ids", ids), ("diverged_at", at)):
        if len(arr) != n_seeds:
            raise ValueError(f"{label} has {len(arr)} entries for {n_seeds} seeds")

    steps = history.steps
    cols = np.arange(n_seeds)
    if n_evals:
        best = np.argmin(np.nan_to_num(history.interpolation_mse, nan=np.inf), axis=0)
        interp_best = history.interpolation_mse[best, cols]
    else:
        best = np.zeros(n_seeds, dtype=np.int64)
        interp_best = np.full(n_seeds, np.nan)

    below = {n: history.extrapolation_mse[n] < float(thresholds[n]) for n in names}  # NaN → False
    needs = dict(prerequisites or {})
    unknown = sorted({p for n in names for p in needs.get(n, ()) if p not in below})
    if unknown:
        raise ValueError(f"prerequisite range(s) {unknown} are not in the history")
    below = {n: np.logical_and.reduce([below[n], *(below[p] for p in needs.get(n, ()))]) for n in names}
    ok_range = {
        n: (below[n][best, cols] if n_evals else np.zeros(n_seeds, bool)) & ~div for n in names
    }
    success = np.logical_and.reduce([ok_range[n] for n in names]) if names else ~div
    all_below = np.logical_and.reduce([below[n] for n in names]) if names else np.ones((n_evals, n_seeds), bool)
    solved = _first_true(all_below)
    solved_range = {n: _first_true(below[n]) for n in names}
    extrap_best = {
        n: (history.extrapolation_mse[n][best, cols] if n_evals else np.full(n_seeds, np.nan)) for n in names
    }

    out = []
    for s in range(n_seeds):
        out.append(SeedMetrics(
            seed=ids[s],
            success=bool(success[s]),
            success_per_range={n: bool(ok_range[n][s]) for n in names},
            best_step=int(steps[best[s]]) if n_evals else None,
            interpolation_mse=float(interp_best[s]),
            extrapolation_mse={n: float(extrap_best[n][s]) for n in names},
            solved_at=int(steps[solved[s]]) if success[s] else None,
            solved_at_per_range={
                n: int(steps[solved_range[n][s]]) if ok_range[n][s] else None for n in names
            },
            sparsity_error=float(sparsity[s]),
            diverged=bool(div[s]),
            diverged_at=_step_or_none(at[s]) if div[s] else None,
            final_sparsity_error=float(final_sparsity[s]),
        ))
    return out


# -- over seeds -----------------------------------------------------------------------------------
class AggregateMetrics(BaseModel):
    """A setting's result over its S seeds (docs/domain/metrics.md); intervals are 95%.

    Field names are the MLflow metric keys and report columns (`to_metrics` flattens the
    per-range dicts as ``name.range``). ``None`` where a statistic is undefined (no solved
    seed, a single value, ...).
    """

    model_config = ConfigDict(frozen=True)

    n_seeds: int
    successes: int
    success_rate: JsonFloat
    success_ci_low: JsonFloat
    success_ci_high: JsonFloat
    success_rate_per_range: dict[str, JsonFloat]
    solved_at_median: JsonFloat | None = None
    solved_at_median_ci_low: JsonFloat | None = None
    solved_at_median_ci_high: JsonFloat | None = None
    solved_at_mean: JsonFloat | None = None
    solved_at_mean_ci_low: JsonFloat | None = None
    solved_at_mean_ci_high: JsonFloat | None = None
    # the papers' figure: mean over *solved* seeds of the sparsity error at each one's best step
    sparsity_error_mean: JsonFloat | None = None
    sparsity_error_ci_low: JsonFloat | None = None
    sparsity_error_ci_high: JsonFloat | None = None
    # the final model's sparsity error, mean over non-diverged seeds
    final_sparsity_error_mean: JsonFloat | None = None
    final_sparsity_error_ci_low: JsonFloat | None = None
    final_sparsity_error_ci_high: JsonFloat | None = None
    diverged: int
    interpolation_mse_median: JsonFloat | None = None
    extrapolation_mse_median: dict[str, JsonFloat | None]

    def to_metrics(self) -> dict[str, float]:
        """Flat ``{key: value}`` for MLflow: undefined (None/NaN) values are left out."""
        flat: dict[str, float] = {}
        for key, value in self.model_dump().items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, v in items:
                if v is None or isinstance(v, bool) or not math.isfinite(float(v)):
                    continue
                flat[key if sub is None else f"{key}.{sub}"] = float(v)
        return flat


def _nan_median(values: np.ndarray) -> float | None:
    """Median ignoring NaN (inf counts); ``None`` when nothing is left."""
    v = values[~np.isnan(values)]
    return float(np.median(v)) if v.size else None


def aggregate(seeds: Sequence[SeedMetrics], confidence: float = 0.95) -> AggregateMetrics:
    """Success rate with a Wilson interval, ``solved_at`` median (order-statistics interval)
    and mean (t interval) over solved seeds, the mean sparsity error at the best step (t
    interval) over solved seeds (the NAU paper's figure), the final model's mean sparsity
    error (t interval) over non-diverged seeds, each over finite values only, diverged
    count, and median MSEs at each seed's best step. The t intervals of these non-negative
    quantities end at 0 at the lowest (`mean_interval`'s ``floor``)."""
    n = len(seeds)
    successes = sum(s.success for s in seeds)
    low, high = wilson_interval(successes, n, confidence)
    names = list(seeds[0].extrapolation_mse) if seeds else []
    solved = np.array([s.solved_at for s in seeds if s.success and s.solved_at is not None], dtype=np.float64)
    med, med_lo, med_hi = median_interval(solved, confidence)
    mean, mean_lo, mean_hi = mean_interval(solved, confidence, floor=0.0)
    sparsity = np.array([s.sparsity_error for s in seeds if s.success], dtype=np.float64)
    sp_mean, sp_lo, sp_hi = mean_interval(sparsity[np.isfinite(sparsity)], confidence, floor=0.0)
    final = np.array([s.final_sparsity_error for s in seeds if not s.diverged], dtype=np.float64)
    fin_mean, fin_lo, fin_hi = mean_interval(final[np.isfinite(final)], confidence, floor=0.0)
    interp = np.array([s.interpolation_mse for s in seeds], dtype=np.float64)
    return AggregateMetrics(
        n_seeds=n,
        successes=successes,
        success_rate=successes / n if n else 0.0,
        success_ci_low=low,
        success_ci_high=high,
        success_rate_per_range={
            r: (sum(s.success_per_range.get(r, False) for s in seeds) / n if n else 0.0) for r in names
        },
        solved_at_median=med, solved_at_median_ci_low=med_lo, solved_at_median_ci_high=med_hi,
        solved_at_mean=mean, solved_at_mean_ci_low=mean_lo, solved_at_mean_ci_high=mean_hi,
        sparsity_error_mean=sp_mean, sparsity_error_ci_low=sp_lo, sparsity_error_ci_high=sp_hi,
        final_sparsity_error_mean=fin_mean, final_sparsity_error_ci_low=fin_lo,
        final_sparsity_error_ci_high=fin_hi,
        diverged=sum(s.diverged for s in seeds),
        interpolation_mse_median=_nan_median(interp),
        extrapolation_mse_median={
            r: _nan_median(np.array([s.extrapolation_mse.get(r, np.nan) for s in seeds], dtype=np.float64))
            for r in names
        },
    )


# -- weights ------------------------------------------------------------------------------------
def sparsity_error(weights: Sequence[torch.Tensor | np.ndarray]) -> torch.Tensor | np.ndarray:
    """Per seed ``max over all weights of min(|W|, |1 − |W||)`` for ``weights [S, ...]``.

    A torch tensor (on the weights' device) when every weight is one, else numpy float64.
    NaN weights give NaN for that seed.
    """
    import torch

    if not weights:
        raise ValueError("sparsity_error needs at least one weight tensor")
    if all(isinstance(w, torch.Tensor) for w in weights):
        per = []
        for w in weights:
            a = w.detach().abs().flatten(1)
            per.append(torch.minimum(a, (1 - a).abs()).amax(1))
        return torch.stack(per).amax(0)
    per_np = []
    for w in weights:
        arr = w.detach().cpu().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
        a = np.abs(arr.astype(np.float64)).reshape(arr.shape[0], -1)
        per_np.append(np.minimum(a, np.abs(1 - a)).max(axis=1))
    return np.max(np.stack(per_np), axis=0)
