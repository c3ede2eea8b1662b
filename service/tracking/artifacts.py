"""Files logged with each trial: a per-seed table, learned weights, curves and heatmaps.

Written into a directory and uploaded to the trial's MLflow run in one call; nothing is
left in the Ray trial's (temporary) working directory.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

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


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten(value: float, _position: Any = None) -> str:
    """A log axis's tick label as plain text ("10⁻³"; "2e-05" off the powers of ten):
    matplotlib's own labels are mathtext, whose parser costs a worker about 0.4 s to
    build for its first plot (issue 14)."""
    if not math.isfinite(value) or value <= 0:
        return ""
    exponent = math.log10(value)
    if abs(exponent - round(exponent)) < 1e-9:
        return "10" + str(round(exponent)).translate(SUPERSCRIPT)
    return f"{value:.0e}".replace("e-0", "e-").replace("e+0", "e")


def log_axis(ax: Any, low: float, high: float) -> None:
    """A log-scale y axis from ``low`` to ``high`` labelled in plain text (`power_of_ten`)
    and without minor ticks (each a tick object made and measured at every drawing); under
    two decades its ticks also sit at 2 and 5 times the powers, so it always has labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_yscale("log")
    ax.set_ylim(low, high)
    narrow = low > 0 and high / low < 100
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if narrow else (1.0,)))
    ax.yaxis.set_major_formatter(FuncFormatter(power_of_ten))
    ax.yaxis.set_minor_locator(NullLocator())


def curves_figure(result: RunResult, title: str = "") -> Any:
    """Interpolation and extrapolation MSE per seed over training (log scale), with each
    range's success threshold; successful seeds drawn in colour, failed ones in grey: a
    matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    h = result.history
    panels = [("interpolation", h.interpolation_mse, None)] + [
        (n, v, result.thresholds.get(n)) for n, v in h.extrapolation_mse.items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    # one collection per group instead of a line per seed, and a fixed layout instead of
    # tight_layout: this plot is drawn at the end of every trial (issue 14, sweep overhead)
    fig.subplots_adjust(left=0.08 / len(panels) + 0.02, right=0.98, bottom=0.14, top=0.82, wspace=0.3)
    steps = np.asarray(h.steps, dtype=np.float64)
    success = np.array([seed.success for seed in result.seeds], dtype=bool)
    colours = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for ax, (name, values, threshold) in zip(axes[0], panels):
        vals = np.where(np.isfinite(values) & (values > 0), values, np.nan)
        lines = [np.column_stack([steps, vals[:, k]]) for k in range(vals.shape[1])]
        failed = [line for line, ok in zip(lines, success) if not ok]
        solved = [line for line, ok in zip(lines, success) if ok]
        if failed:
            ax.add_collection(LineCollection(failed, colors="0.6", linewidths=1, alpha=0.5))
        if solved:
            ax.add_collection(LineCollection(solved, colors=[colours[i % len(colours)] for i in range(len(solved))],
                                             linewidths=1, alpha=0.8))
        finite_vals = vals[np.isfinite(vals)]
        if steps.size and finite_vals.size:
            ax.set_xlim(steps.min(), max(steps.max(), steps.min() + 1))
            low, high = finite_vals.min(), finite_vals.max()
            if threshold and threshold > 0:  # the threshold line stays in view
                low, high = min(low, threshold), max(high, threshold)
            ax.set_ylim(low / 1.5, high * 1.5)
        if threshold:
            ax.axhline(threshold, color="k", ls="--", lw=1, label="success threshold")
            ax.legend(loc="best", fontsize=8)
        if finite_vals.size:
            log_axis(ax, *ax.get_ylim())
        ax.set_title(f"{name} MSE", y=1.0, pad=4)  # given: not placed by measuring the tick labels
        ax.set_xlabel("step")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_curves(result: RunResult, path: Path, title: str = "") -> Path:
    """`curves_figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = curves_figure(result, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# the cells of a matrix this small get their values written in them
ANNOTATED_CELLS, ANNOTATED_COLUMNS = 48, 12


def weights_figure(result: RunResult, seeds: dict[str, int]) -> Any:
    """Heatmaps of every learned weight matrix, one row per chosen seed (colour −1 … 1, the
    values written in the cells of a small matrix, integer cell indices): a matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = list(result.weights)
    rows = list(seeds.items())
    n_rows, n_cols = max(1, len(rows)), max(1, len(names))
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.4 * n_cols + 0.9, 2.6 * n_rows), squeeze=False)
    # a fixed layout, with room for each panel's title and labels (tight_layout would
    # measure every label, at the end of every trial); the colour bar in its own axes
    fig.subplots_adjust(left=0.05 + 0.05 / n_cols, right=0.86, bottom=0.06 + 0.1 / n_rows,
                        top=1 - 0.1 / n_rows, wspace=0.35, hspace=0.5)
    image = None
    for i, (role, k) in enumerate(rows):
        for j, name in enumerate(names):
            ax = axes[i][j]
            w = np.asarray(result.weights[name][k], dtype=np.float64)
            image = ax.imshow(np.nan_to_num(w, nan=0.0), cmap="RdBu_r", vmin=-1, vmax=1,
                              aspect="auto", interpolation="nearest")
            if w.ndim == 2 and w.size <= ANNOTATED_CELLS and w.shape[1] <= ANNOTATED_COLUMNS:
                for (r, c), v in np.ndenumerate(w):
                    ax.text(c, r, f"{v:.2f}" if math.isfinite(v) else "nan", ha="center", va="center",
                            fontsize=7, color="white" if math.isfinite(v) and abs(v) > 0.6 else "black")
            ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True, min_n_ticks=1))
            ax.yaxis.set_major_locator(MaxNLocator(nbins=6, integer=True, min_n_ticks=1))
            # a given title position: matplotlib would otherwise measure the tick labels to place it
            ax.set_title(f"{role} (seed {result.seeds[k].seed}) · {name}", fontsize=8, y=1.0, pad=3)
            ax.set_xlabel("in", fontsize=7)
            ax.set_ylabel("out", fontsize=7)
            ax.tick_params(labelsize=6)
    if image is not None:
        fig.colorbar(image, cax=fig.add_axes((0.89, 0.15, 0.02, 0.7)))
    return fig


def plot_weights(result: RunResult, seeds: dict[str, int], path: Path) -> Path:
    """`weights_figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = weights_figure(result, seeds)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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
    files.append(plot_curves(result, directory / "plots" / "curves.png", title))
    if result.weights and chosen:
        files.append(plot_weights(result, chosen, directory / "plots" / "weights.png"))
    return files
