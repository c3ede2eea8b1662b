"""The worker's warm plotting process: the same PNGs as drawing in the worker, from a file
of plain arrays; the worker draws them itself where the process died or failed; the
process ends with the worker's pipe."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.tracking import plot_server
from service.tracking.figures import (
    CurvesPlot,
    WeightsPlot,
    draw_plots,
    load_plots,
    save_plots,
)
from service.tracking.plot_server import PlotServer


def _plots() -> tuple[CurvesPlot, WeightsPlot]:
    rng = np.random.default_rng(3)
    steps = np.arange(0, 1100, 100, dtype=np.float64)
    interpolation = 10.0 ** rng.uniform(-9, 1, size=(len(steps), 5))
    extrapolation = 10.0 ** rng.uniform(-7, 3, size=(len(steps), 5))
    extrapolation[4:, 2] = np.nan  # a diverged seed
    curves = CurvesPlot(steps=steps, names=("interpolation", "extrapolation"),
                        values=(interpolation, extrapolation), thresholds=(None, 1.5e-5),
                        success=np.array([True, False, False, True, False]), title="lr=0.01: success 2/5")
    weights = WeightsPlot(rows=("best (seed 3)", "failed (seed 1)"), names=("layers.0.W", "layers.1.W"),
                          matrices=((rng.uniform(-1, 1, (2, 4)), np.array([[1.0, math.nan]])),
                                    (rng.uniform(-1, 1, (2, 4)), rng.uniform(-1, 1, (1, 40)))))
    return curves, weights


def test_the_figures_contents_survive_their_file(tmp_path):
    curves, weights = _plots()
    loaded_curves, loaded_weights = load_plots(save_plots(tmp_path / "p.npz", curves, weights))
    assert loaded_curves.names == curves.names and loaded_curves.title == curves.title
    assert loaded_curves.thresholds == curves.thresholds
    np.testing.assert_array_equal(loaded_curves.steps, curves.steps)
    np.testing.assert_array_equal(loaded_curves.success, curves.success)
    for got, want in zip(loaded_curves.values, curves.values):
        np.testing.assert_array_equal(got, want)
    assert loaded_weights.rows == weights.rows and loaded_weights.names == weights.names
    for got_row, want_row in zip(loaded_weights.matrices, weights.matrices):
        for got, want in zip(got_row, want_row):
            np.testing.assert_array_equal(got, want)
    assert load_plots(save_plots(tmp_path / "q.npz", curves, None))[1] is None


def test_the_server_draws_the_pngs_this_process_draws(tmp_path):
    curves, weights = _plots()
    here = draw_plots(curves, weights, tmp_path / "here" / "curves.png", tmp_path / "here" / "weights.png")
    server = PlotServer()
    try:
        contents = save_plots(tmp_path / "p.npz", curves, weights)
        there = [tmp_path / "there" / "plots" / "curves.png", tmp_path / "there" / "plots" / "weights.png"]
        assert server.draw({"contents": str(contents), "curves": str(there[0]), "weights": str(there[1])})
        for a, b in zip(here, there):
            assert b.read_bytes() == a.read_bytes()
        # a job it cannot do is answered, and the server goes on
        assert not server.draw({"contents": str(tmp_path / "missing.npz"), "curves": str(there[0])})
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_the_warm_up_stops_when_a_job_waits():
    """A throw-away figure drawn while a real job waits would only delay it."""
    assert plot_server.warm_up(lambda: False) == 2
    assert plot_server.warm_up(lambda: True) == 0
    answers = iter([False, True])
    assert plot_server.warm_up(lambda: next(answers)) == 1


def test_the_server_ends_when_the_worker_closes_its_pipe():
    server = PlotServer()
    server.send.close()
    assert server.proc.wait(timeout=60) == 0
    server.stop()


@pytest.fixture
def fresh_server():
    plot_server.stop()
    plot_server.start(cold_only=False)
    yield plot_server.current()
    plot_server.stop()


def test_draw_uses_the_running_server(fresh_server, tmp_path):
    curves, weights = _plots()
    files = plot_server.draw(curves, weights, tmp_path / "plots" / "curves.png", tmp_path / "plots" / "weights.png")
    assert [f.name for f in files] == ["curves.png", "weights.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)
    assert plot_server.current() is fresh_server and fresh_server.proc.poll() is None


def test_a_dead_server_is_given_up_and_the_plots_drawn_here(fresh_server, tmp_path):
    curves, weights = _plots()
    fresh_server.proc.kill()
    fresh_server.proc.wait()
    files = plot_server.draw(curves, None, tmp_path / "plots" / "curves.png", None)
    assert [f.name for f in files] == ["curves.png"]
    here = draw_plots(curves, weights, tmp_path / "here.png", None)
    assert files[0].read_bytes() == here[0].read_bytes()
    assert plot_server.current() is None


def test_no_server_is_started_where_matplotlib_is_loaded_already():
    import matplotlib.pyplot  # noqa: F401

    plot_server.stop()
    plot_server.start()
    assert plot_server.current() is None
