"""Per-trial artifacts from a real (tiny) result: per-seed CSV, weights JSON, PNG plots."""

from __future__ import annotations

import csv
import json

import pytest

from service.config import RunConfig
from service.tracking.artifacts import best_and_failed, curves_plot, weights_plot, write_trial_artifacts
from service.tracking.figures import curves_figure, log_axis, power_of_ten, weights_figure
from service.training import train


@pytest.fixture(scope="module")
def result():
    config = RunConfig.model_validate({
        "task": {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": {"steps": 300, "batch_size": 32, "eval_every": 100, "optimizer": {"lr": 0.05},
                  "regularizer": {"lambda_max": 0.1, "t_start": 50, "t_end": 200}},
        "seeds": 6, "device": "cpu", "compile": "off",
    })
    return train(config)


def test_artifacts_are_written(result, tmp_path):
    files = write_trial_artifacts(result, tmp_path, title="tiny")
    names = {p.relative_to(tmp_path).as_posix() for p in files}
    assert {"seeds.csv", "weights/best_seed.json", "plots/curves.png", "plots/weights.png"} <= names
    for png in ("plots/curves.png", "plots/weights.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    rows = list(csv.DictReader((tmp_path / "seeds.csv").open()))
    assert [int(r["seed"]) for r in rows] == [s.seed for s in result.seeds]
    assert {"success", "best_step", "interpolation_mse", "extrapolation_mse.extrapolation",
            "threshold.extrapolation", "solved_at", "sparsity_error", "diverged"} <= set(rows[0])

    best = json.loads((tmp_path / "weights/best_seed.json").read_text())
    assert set(best["weights"]) == set(result.weights)
    for name, matrix in best["weights"].items():
        assert len(matrix) == result.weights[name].shape[1]


def test_best_and_failed_seed_choice(result):
    best, failed = best_and_failed(result)
    seeds = result.seeds
    if any(s.success for s in seeds):
        assert seeds[best].success
    if failed is not None:
        assert not seeds[failed].success and failed != best
    else:
        assert all(s.success for s in seeds if s is not seeds[best])


def test_weight_heatmaps_show_small_matrices_values_and_integer_cell_indices(result):
    """A small matrix has each cell's value written in it, a large one none; the axes number
    the cells by whole indices."""
    import dataclasses

    import matplotlib.pyplot as plt
    import numpy as np

    wide = dataclasses.replace(result, weights={**result.weights, "wide": np.zeros((len(result.seeds), 3, 40))})
    fig = weights_figure(weights_plot(wide, {"best": 0}))
    try:
        panels = {ax.get_title().split(" · ")[-1]: ax for ax in fig.axes if " · " in ax.get_title()}
        for name, w in result.weights.items():
            written = sorted(float(t.get_text()) for t in panels[name].texts)
            assert written == sorted(round(float(v), 2) for v in np.ravel(w[0]))
        assert len(panels["wide"].texts) == 0
        for ax in panels.values():
            for ticks in (ax.get_xticks(), ax.get_yticks()):
                assert len(ticks) and all(float(t).is_integer() for t in ticks)
    finally:
        plt.close(fig)


def test_log_axis_labels_are_plain_text_powers_of_ten():
    assert [power_of_ten(v) for v in (1e-3, 1.0, 100.0, 2e-5, 0.0, float("nan"))] == [
        "10⁻³", "10⁰", "10²", "2e-5", "", ""]


def test_the_curves_label_their_log_axes_without_mathtext_or_minor_ticks(result):
    """matplotlib's own log labels are mathtext, whose parser a worker builds for its first
    plot (about 0.4 s), and its minor ticks are objects made and measured at each drawing."""
    import matplotlib.pyplot as plt

    fig = curves_figure(curves_plot(result, title="tiny"))
    try:
        fig.canvas.draw()
        logs = [ax for ax in fig.axes if ax.get_yscale() == "log"]
        assert logs
        for ax in logs:
            labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
            assert labels and all("$" not in t for t in labels), labels
            assert any(t.startswith("10") for t in labels), labels
            assert len(ax.yaxis.get_minorticklocs()) == 0
    finally:
        plt.close(fig)


@pytest.mark.parametrize("low, high", [(1e-6, 1e3), (2e-3, 8e-3), (0.5, 3.0)])
def test_a_log_axis_has_labels_over_any_range(low, high):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        ax.plot([0, 1], [low, high])
        log_axis(ax, low, high)
        fig.canvas.draw()
        shown = [t.get_text() for t, y in zip(ax.get_yticklabels(), ax.get_yticks())
                 if t.get_text() and low <= y <= high]
        assert len(shown) >= 2, shown
    finally:
        plt.close(fig)
