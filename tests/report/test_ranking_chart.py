"""The report's ranking chart, read where the browser draws it: each point at its success
rate on the axis (a 32/32 at 1, a 0/4 at 0, both visible), and the static ranking.png
best first."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from service.report.build import build_report
from service.tracking import store

HERE = Path(__file__).resolve().parent


def _load(name: str, file: str):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


browser = _load("report_browser", "browser.py")
recorded = _load("report_recorded", "recorded.py")

ADAM = {"lr": 0.1, "optimizer": "adam", "lambda_max": 0.1, "nau_init": "default"}
SGD = {"lr": 0.29, "optimizer": "sgd", "momentum": 0.9, "lambda_max": 0.5, "nau_init": "default"}

# what the page draws: each plotted point's centre, and each labelled tick of the rate axis
DRAWN = """(() => {
  const box = el => { const r = el.getBoundingClientRect(); return [(r.left + r.right) / 2, (r.top + r.bottom) / 2]; };
  const plot = document.getElementById('plot-ranking');
  const area = plot.querySelector('.nsewdrag').getBoundingClientRect();
  return {
    area: [area.left, area.right, area.top, area.bottom],
    traces: Array.from(plot.querySelectorAll('.scatterlayer .trace')).map(
      t => Array.from(t.querySelectorAll('.points path.point')).map(box)),
    ticks: Array.from(plot.querySelectorAll('.xtick text')).map(t => [parseFloat(t.textContent), box(t)[0]]),
  };
})()"""


def _rate_at(ticks: list[list[float]], x: float) -> float:
    """The success rate at pixel ``x``: linear between the first and last labelled ticks."""
    (v0, x0), (v1, x1) = ticks[0], ticks[-1]
    return v0 + (x - x0) * (v1 - v0) / (x1 - x0)


def test_each_point_is_drawn_at_its_success_rate(tmp_path):
    binary = browser.chromium()
    if binary is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    uri = store.default_tracking_uri(tmp_path)
    # rates a quarter apart and two settings at the same rate, as a 4-seed search gives
    # them: plotly's "group" scatter mode then shifted each trace along the rate axis
    good, *_ = recorded.record_sweep(uri, "chart", [
        ("completed", ADAM, recorded.rate_metrics(3, 4)),
        ("completed", {**ADAM, "lr": 0.2}, recorded.rate_metrics(1, 4)),
        ("completed", SGD, recorded.rate_metrics(0, 4)),
        ("completed", {**SGD, "lr": 0.2}, recorded.rate_metrics(0, 4)),
    ])
    recorded.record_validation(uri, "chart", good, 32, 32, first_seed=4)
    files = build_report(uri, "chart", tmp_path / "out", log_to_mlflow=False, pngs=False)

    page = browser.Page(binary, tmp_path / "chromium-profile")
    try:
        page.load(files.html.resolve().as_uri())
        assert page.errors() == []
        drawn = page.evaluate(DRAWN)
    finally:
        page.close()
    ticks = sorted(t for t in drawn["ticks"] if t[0] == t[0])  # labelled ticks, by value
    assert len(ticks) >= 3, drawn
    # how far one hundredth of the rate axis is on the screen: the tolerance below is 1 px
    px = (ticks[-1][1] - ticks[0][1]) / (ticks[-1][0] - ticks[0][0])
    assert px > 300, f"the rate axis is only {px:.0f} px wide"
    search, validation = drawn["traces"]
    rates = sorted(round(_rate_at(ticks, x), 4) for x, _ in search)
    assert rates == pytest.approx([0.0, 0.0, 0.25, 0.75], abs=1 / px), f"search points drawn at {rates}"
    (x, y), = validation
    assert _rate_at(ticks, x) == pytest.approx(1.0, abs=1 / px), "the 32/32 validation is not drawn at 1"
    left, right, top, bottom = drawn["area"]
    for x, y in [*search, *validation]:  # every point inside the plot, none cut off at an edge
        assert left + 3 <= x <= right - 3 and top <= y <= bottom, (x, y, drawn["area"])
    # the search and validation points of one setting share its row
    three_quarters = next(p for p in search if abs(_rate_at(ticks, p[0]) - 0.75) < 0.01)
    zero = next(p for p in search if abs(_rate_at(ticks, p[0])) < 0.01)
    assert abs(three_quarters[1] - y) < abs(zero[1] - y)


def test_the_static_ranking_is_best_first(tmp_path):
    """ranking.png reads top-down like the interactive chart and `best`: #1 on top."""
    from service.report.build import static_figure
    from service.report.data import load_report_data
    from service.report.panels import ranking_forest

    uri = store.default_tracking_uri(tmp_path)
    recorded.record_sweep(uri, "order", [
        ("completed", {**ADAM, "lr": 0.2}, recorded.rate_metrics(1, 4)),
        ("completed", ADAM, recorded.rate_metrics(3, 4)),
        ("completed", SGD, recorded.rate_metrics(0, 4)),
    ])
    panel = ranking_forest(load_report_data(uri, "order", top=0), {})
    ax = static_figure(panel, "ranking").axes[0]
    height = {label.get_text(): ax.transData.transform((0, y))[1]
              for label, y in zip(ax.get_yticklabels(), ax.get_yticks())}
    top_down = sorted(height, key=height.get, reverse=True)  # display y grows upwards
    assert top_down == ["#1 trial-t1", "#2 trial-t0", "#3 trial-t2"]


def test_a_static_sweep_has_no_recurrent_panel(tmp_path):
    """Test lengths mean nothing to a static task: no panel (and no PNG) says so."""
    uri = store.default_tracking_uri(tmp_path)
    recorded.record_sweep(uri, "static", [("completed", ADAM, recorded.rate_metrics(3, 4))])
    files = build_report(uri, "static", tmp_path / "out", log_to_mlflow=False)
    html = files.html.read_text()
    assert "panel-success_vs_length" not in html and "not a recurrent" not in html
    assert "success_vs_length.png" not in {p.name for p in files.pngs}
    assert "panel-ranking" in html and "ranking.png" in {p.name for p in files.pngs}
