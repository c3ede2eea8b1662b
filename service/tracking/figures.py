"""A trial's two figures (per-seed MSE curves, learned-weight heatmaps) from plain arrays.

They take numbers, not a trial's result, so that a process that loads neither torch nor the
training code can draw them: the warm plotting process of `plot_server`. What they show is
saved to and loaded from one ``.npz`` file of plain arrays (`save_plots`, `load_plots`;
nothing is unpickled) and drawn into PNGs by `draw_plots`, in that process or in this one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CurvesPlot:
    """Per-seed MSE over training, one panel per range (``interpolation`` first)."""

    steps: np.ndarray  # [T]
    names: tuple[str, ...]
    values: tuple[np.ndarray, ...]  # per panel [T, S]
    thresholds: tuple[float | None, ...]  # per panel: its range's success threshold
    success: np.ndarray  # [S] bool
    title: str = ""


@dataclass(frozen=True)
class WeightsPlot:
    """Learned weight matrices of a few chosen seeds: one row per seed, one panel per matrix."""

    rows: tuple[str, ...]  # "best (seed 3)", ...
    names: tuple[str, ...]
    matrices: tuple[tuple[np.ndarray, ...], ...]  # [row][name] -> [out, in]


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


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def curves_figure(plot: CurvesPlot) -> Any:
    """Interpolation and extrapolation MSE per seed over training (log scale), with each
    range's success threshold; successful seeds drawn in colour, failed ones in grey: a
    matplotlib figure."""
    plt = _pyplot()
    from matplotlib.collections import LineCollection

    n = len(plot.names)
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 3.8), squeeze=False)
    # one collection per group instead of a line per seed, and a fixed layout instead of
    # tight_layout: this plot is drawn at the end of every trial (issue 14, sweep overhead)
    fig.subplots_adjust(left=0.08 / n + 0.02, right=0.98, bottom=0.14, top=0.82, wspace=0.3)
    steps = np.asarray(plot.steps, dtype=np.float64)
    success = np.asarray(plot.success, dtype=bool)
    colours = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for ax, name, values, threshold in zip(axes[0], plot.names, plot.values, plot.thresholds):
        values = np.asarray(values, dtype=np.float64)
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
    if plot.title:
        fig.suptitle(plot.title, fontsize=10)
    return fig


# the cells of a matrix this small get their values written in them
ANNOTATED_CELLS, ANNOTATED_COLUMNS = 48, 12


def weights_figure(plot: WeightsPlot) -> Any:
    """Heatmaps of every learned weight matrix, one row per chosen seed (colour −1 … 1, the
    values written in the cells of a small matrix, integer cell indices): a matplotlib figure."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    n_rows, n_cols = max(1, len(plot.rows)), max(1, len(plot.names))
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.4 * n_cols + 0.9, 2.6 * n_rows), squeeze=False)
    # a fixed layout, with room for each panel's title and labels (tight_layout would
    # measure every label, at the end of every trial); the colour bar in its own axes
    fig.subplots_adjust(left=0.05 + 0.05 / n_cols, right=0.86, bottom=0.06 + 0.1 / n_rows,
                        top=1 - 0.1 / n_rows, wspace=0.35, hspace=0.5)
    image = None
    for i, (row, matrices) in enumerate(zip(plot.rows, plot.matrices)):
        for j, (name, matrix) in enumerate(zip(plot.names, matrices)):
            ax = axes[i][j]
            w = np.asarray(matrix, dtype=np.float64)
            image = ax.imshow(np.nan_to_num(w, nan=0.0), cmap="RdBu_r", vmin=-1, vmax=1,
                              aspect="auto", interpolation="nearest")
            if w.ndim == 2 and w.size <= ANNOTATED_CELLS and w.shape[1] <= ANNOTATED_COLUMNS:
                for (r, c), v in np.ndenumerate(w):
                    ax.text(c, r, f"{v:.2f}" if math.isfinite(v) else "nan", ha="center", va="center",
                            fontsize=7, color="white" if math.isfinite(v) and abs(v) > 0.6 else "black")
            ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True, min_n_ticks=1))
            ax.yaxis.set_major_locator(MaxNLocator(nbins=6, integer=True, min_n_ticks=1))
            # a given title position: matplotlib would otherwise measure the tick labels to place it
            ax.set_title(f"{row} · {name}", fontsize=8, y=1.0, pad=3)
            ax.set_xlabel("in", fontsize=7)
            ax.set_ylabel("out", fontsize=7)
            ax.tick_params(labelsize=6)
    if image is not None:
        fig.colorbar(image, cax=fig.add_axes((0.89, 0.15, 0.02, 0.7)))
    return fig


def save_figure(fig: Any, path: Path) -> Path:
    """``fig`` as a PNG at ``path`` (90 dpi), then closed."""
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def draw_plots(curves: CurvesPlot, weights: WeightsPlot | None, curves_path: Path,
               weights_path: Path | None) -> list[Path]:
    """Both figures as PNGs (the heatmaps only with ``weights`` and ``weights_path``)."""
    files = [save_figure(curves_figure(curves), curves_path)]
    if weights is not None and weights_path is not None:
        files.append(save_figure(weights_figure(weights), weights_path))
    return files


def save_plots(path: Path, curves: CurvesPlot, weights: WeightsPlot | None) -> Path:
    """What both figures show, as one ``.npz`` of plain arrays and a JSON header."""
    arrays: dict[str, np.ndarray] = {
        "steps": np.asarray(curves.steps, dtype=np.float64),
        "success": np.asarray(curves.success, dtype=bool),
    }
    for i, values in enumerate(curves.values):
        arrays[f"curve_{i}"] = np.asarray(values, dtype=np.float64)
    header: dict[str, Any] = {"names": list(curves.names), "thresholds": list(curves.thresholds),
                              "title": curves.title, "weights": None}
    if weights is not None:
        header["weights"] = {"rows": list(weights.rows), "names": list(weights.names)}
        for i, matrices in enumerate(weights.matrices):
            for j, matrix in enumerate(matrices):
                arrays[f"weights_{i}_{j}"] = np.asarray(matrix, dtype=np.float64)
    arrays["header"] = np.array(json.dumps(header))
    with path.open("wb") as f:
        np.savez(f, **arrays)
    return path


def load_plots(path: Path) -> tuple[CurvesPlot, WeightsPlot | None]:
    """`save_plots`'s file back as the two figures' contents."""
    with np.load(path, allow_pickle=False) as data:
        header = json.loads(str(data["header"]))
        curves = CurvesPlot(
            steps=data["steps"], names=tuple(header["names"]),
            values=tuple(data[f"curve_{i}"] for i in range(len(header["names"]))),
            thresholds=tuple(header["thresholds"]), success=data["success"], title=header["title"])
        weights = None
        if header["weights"] is not None:
            rows, names = header["weights"]["rows"], header["weights"]["names"]
            weights = WeightsPlot(rows=tuple(rows), names=tuple(names), matrices=tuple(
                tuple(data[f"weights_{i}_{j}"] for j in range(len(names))) for i in range(len(rows))))
    return curves, weights
