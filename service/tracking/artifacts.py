"""Files logged with each trial: a per-seed table, learned weights, curves and heatmaps.

Written into a directory and uploaded to the trial's MLflow run in one call; nothing is
left in the Ray trial's (temporary) working directory. The figures are drawn by `figures`
from what `curves_plot` and `weights_plot` take out of the result, in the worker's warm
plotting process where it has one (`plot_server`).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from service.tracking import plot_server
from service.tracking.figures import CurvesPlot, WeightsPlot
from service.training.result import RunResult


def _ratio(result: RunResult, k: int) -> float:
    """Seed k's worst extrapolation MSE relative to its range's threshold (NaN → inf)."""
    seed = result.seeds[k]
    ratios = []
    for name, mse in seed.extrapolation_mse.items():
        thr = result.thresholds.get(name, float("nan"))
        value = mse / thr if thr and math.isfinite(mse) and math.isfinite(thr) else math.inf
        ratios.append(value)
    return max(ratios) if ratios else math.inf


def best_and_failed(result: RunResult) -> tuple[int | None, int | None]:
    """Batch positions of the best seed (successful first, then the lowest extrapolation
    error relative to the threshold) and of a typical failed seed (the median of the failed
    seeds by that error, non-diverged first); ``None`` where there is none."""
    n = len(result.seeds)
    if n == 0:
        return None, None
    order = sorted(range(n), key=lambda k: (not result.seeds[k].success, _ratio(result, k)))
    best = order[0]
    failed = [k for k in order if not result.seeds[k].success and k != best]
    failed.sort(key=lambda k: (result.seeds[k].diverged, _ratio(result, k)))
    live = [k for k in failed if not result.seeds[k].diverged] or failed
    return best, (live[len(live) // 2] if live else None)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def write_seed_table(result: RunResult, path: Path) -> Path:
    """One row per seed: success, best_step, MSEs and sparsity error at best_step, solved_at,
    the final model's sparsity error, ..."""
    ranges = list(result.thresholds)
    header = ["seed", "success", "best_step", "interpolation_mse",
              *[f"extrapolation_mse.{r}" for r in ranges], *[f"success.{r}" for r in ranges],
              *[f"threshold.{r}" for r in ranges],
              "solved_at", "sparsity_error", "final_sparsity_error", "diverged", "diverged_at",
              "reinitialisations"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        reinit = list(getattr(result, "reinitialisations", []) or [0] * len(result.seeds))
        for s, r in zip(result.seeds, reinit):
            writer.writerow([_cell(v) for v in [
                s.seed, s.success, s.best_step, s.interpolation_mse,
                *[s.extrapolation_mse.get(x) for x in ranges],
                *[s.success_per_range.get(x) for x in ranges],
                *[result.thresholds[x] for x in ranges],
                s.solved_at, s.sparsity_error, s.final_sparsity_error, s.diverged, s.diverged_at, r,
            ]])
    return path


def _matrix(w: np.ndarray) -> list[list[float | None]]:
    return [[float(v) if math.isfinite(float(v)) else None for v in row] for row in np.asarray(w)]


def write_seed_weights(result: RunResult, k: int, role: str, path: Path) -> Path:
    """The learned weight matrices ``{name: [out][in]}`` of batch position ``k`` (JSON)."""
    seed = result.seeds[k]
    data = {
        "role": role,
        "seed": seed.seed,
        "success": seed.success,
        "diverged": seed.diverged,
        "extrapolation_mse": {n: (v if math.isfinite(v) else None) for n, v in seed.extrapolation_mse.items()},
        "thresholds": result.thresholds,
        "sparsity_error": seed.sparsity_error if math.isfinite(seed.sparsity_error) else None,  # best step
        "final_sparsity_error": (seed.final_sparsity_error if math.isfinite(seed.final_sparsity_error)
                                 else None),  # of these (final) weights
        "weights": {name: _matrix(w[k]) for name, w in result.weights.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


def curves_plot(result: RunResult, title: str = "") -> CurvesPlot:
    """What the curves figure shows of ``result``: every seed's interpolation and
    extrapolation MSE over training, each range's threshold, which seeds succeeded."""
    h = result.history
    names = ["interpolation", *h.extrapolation_mse]
    return CurvesPlot(
        steps=np.asarray(h.steps, dtype=np.float64), names=tuple(names),
        values=(np.asarray(h.interpolation_mse), *(np.asarray(v) for v in h.extrapolation_mse.values())),
        thresholds=(None, *(result.thresholds.get(n) for n in h.extrapolation_mse)),
        success=np.array([seed.success for seed in result.seeds], dtype=bool), title=title)


def weights_plot(result: RunResult, seeds: dict[str, int]) -> WeightsPlot:
    """What the heatmaps show: every learned weight matrix of the seeds at the batch
    positions ``seeds`` (``{role: position}``), one row each."""
    names = list(result.weights)
    return WeightsPlot(
        rows=tuple(f"{role} (seed {result.seeds[k].seed})" for role, k in seeds.items()), names=tuple(names),
        matrices=tuple(tuple(np.asarray(result.weights[n][k]) for n in names) for k in seeds.values()))


def write_trial_artifacts(result: RunResult, directory: Path, title: str = "") -> list[Path]:
    """Every artifact of one task's result into ``directory``; returns the files."""
    files = [write_seed_table(result, directory / "seeds.csv")]
    best, failed = best_and_failed(result)
    chosen: dict[str, int] = {}
    if best is not None:
        role = "best" if result.seeds[best].success else "best (no seed succeeded)"
        files.append(write_seed_weights(result, best, role, directory / "weights" / "best_seed.json"))
        chosen["best"] = best
    if failed is not None:
        files.append(write_seed_weights(result, failed, "failed", directory / "weights" / "failed_seed.json"))
        chosen["failed"] = failed
    weights = weights_plot(result, chosen) if result.weights and chosen else None
    files += plot_server.draw(curves_plot(result, title), weights, directory / "plots" / "curves.png",
                              directory / "plots" / "weights.png" if weights is not None else None)
    return files
