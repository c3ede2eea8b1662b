"""Panels for recurrent (sequence) tasks: success against the test sequence length.
Registered with `panel_kind` like those of `service.report.panels`; `service.report.build`
imports this module so they are known."""

from __future__ import annotations

from typing import Any

from service.formatting import finite
from service.report.data import ReportData
from service.report.panels import Panel, empty, panel_kind, plotly_go
from service.scoring.metrics import wilson_interval


LENGTH_KEY = "success_rate_per_range.length_"


def length_rates(metrics: dict[str, float]) -> dict[int, float]:
    """``{test length: success rate}`` from a recurrent trial's per-length metrics."""
    out = {}
    for key, value in metrics.items():
        rate = finite(value)
        if key.startswith(LENGTH_KEY) and key[len(LENGTH_KEY):].isdigit() and rate is not None:
            out[int(key[len(LENGTH_KEY):])] = rate
    return dict(sorted(out.items()))


@panel_kind("success_vs_length")
def success_vs_length(data: ReportData, options: dict[str, Any]) -> Panel | None:
    """Recurrent tasks: success rate (95% Wilson CI) at each test length, top settings;
    ``None`` (no panel) for a sweep of static tasks, where test lengths mean nothing."""
    go = plotly_go()
    rows = data.ranked(int(options.get("top", 5)))
    fig = go.Figure()
    for i, t in enumerate(rows):
        rates = length_rates(t.metrics)
        n = int(t.metrics.get("n_seeds") or 0)
        if not rates or not n:
            continue
        bounds = [wilson_interval(round(r * n), n) for r in rates.values()]
        fig.add_trace(go.Scatter(
            x=list(rates), y=list(rates.values()), mode="lines+markers", name=f"#{i + 1} {t.name}",
            error_y={"type": "data", "symmetric": False, "array": [hi - r for (_, hi), r in zip(bounds, rates.values())],
                     "arrayminus": [r - lo for (lo, _), r in zip(bounds, rates.values())]},
            hovertext=[f"#{i + 1} {t.name}: length {k}, {round(r * n)}/{n} seeds" for k, r in rates.items()],
            hoverinfo="text"))
    if not fig.data:
        if not getattr(data, "recurrent", None):
            return None
        return empty("no per-length metrics yet: no top setting of this recurrent task has finished")
    fig.update_layout(xaxis={"type": "log", "title": "test sequence length"}, height=380,
                      yaxis={"range": [-0.02, 1.02], "title": "success rate (95% Wilson CI)"})
    return Panel(fig, "Share of seeds that solve each test length (at each seed's best-validation step): "
                      "an accurate read-out, and a cell exact on the seed's own read-out at that length "
                      "and every shorter one; the models train on one length only.")

