"""Panels about the search itself: the settings of every trial against its objective
(parallel coordinates) and the objective in trial order with the best so far
(optimisation history). Registered with `panel_kind` like those of `service.report.panels`;
`service.report.build` imports this module so they are known."""

from __future__ import annotations

import math
from typing import Any

from service.formatting import finite, fmt_param
from service.report.data import ReportData
from service.report.panels import Panel, empty, panel_kind
from service.tracking.queries import TrialRow
from service.tracking.store import Outcome

OBJECTIVE_DECIMALS = 4  # as the terminal shows it: tie-breakers below that are noise to a reader


def _finished(data: ReportData) -> list[TrialRow]:
    """Completed and pruned trials with an objective, oldest first."""
    return [t for t in data.view.trials
            if t.outcome in (Outcome.COMPLETED, Outcome.PRUNED) and finite(t.objective) is not None]


def _dimension(data: ReportData, name: str, trials: list[TrialRow]) -> dict[str, Any] | None:
    """One parallel-coordinates axis for parameter ``name``: numbers as they are (log10
    for a log-scale parameter), categories as positions with their labels. ``None`` for a
    numeric parameter some trial does not have (a conditional one: an axis has no gaps)."""
    from service.search.space import CategoricalParam, IntParam, LogUniformParam

    p = data.space.params.get(name) if data.space is not None else None
    values = [t.params.get(name) for t in trials]
    numbers = [finite(v) for v in values]
    categorical = isinstance(p, CategoricalParam) or (p is None and any(
        v is not None and n is None for v, n in zip(values, numbers)))
    if categorical:
        labels = sorted({fmt_param(v) if v is not None else "(inactive)" for v in values})
        index = {label: i for i, label in enumerate(labels)}
        return {"label": name, "values": [index[fmt_param(v) if v is not None else "(inactive)"] for v in values],
                "tickvals": list(range(len(labels))), "ticktext": labels,
                "range": [-0.5, len(labels) - 0.5] if len(labels) > 1 else [-1, 1]}
    if any(n is None for n in numbers):
        return None
    log = isinstance(p, LogUniformParam) or (isinstance(p, IntParam) and p.log)
    if log and all(n > 0 for n in numbers):
        return {"label": f"{name} (log10)", "values": [math.log10(n) for n in numbers]}
    return {"label": name, "values": numbers}


@panel_kind("parallel_coordinates")
def parallel_coordinates(data: ReportData, options: dict[str, Any]) -> Panel:
    """Every finished trial as one line through its settings to its objective."""
    import plotly.graph_objects as go

    trials = _finished(data)
    names = data.searched
    if not names or len(trials) < 2:
        return empty("parallel coordinates need searched parameters and at least 2 finished trials")
    dims, left_out = [], []
    for name in names:
        dim = _dimension(data, name, trials)
        (dims.append(dim) if dim is not None else left_out.append(name))
    objective = [round(float(t.objective), OBJECTIVE_DECIMALS) for t in trials]
    dims.append({"label": "objective", "values": objective})
    fig = go.Figure(go.Parcoords(
        line={"color": objective, "colorscale": "Viridis", "showscale": True,
              "colorbar": {"title": {"text": "objective"}}},
        dimensions=dims))
    fig.update_layout(height=420, margin={"l": 70, "r": 40, "t": 60})
    note = (f"One line per finished trial ({len(trials)}: completed and pruned), from its settings to its "
            f"objective (rounded to {OBJECTIVE_DECIMALS} decimals); drag along an axis to pick a range.")
    if left_out:
        note += f" Left out, present in only some trials: {', '.join(left_out)}."
    return Panel(fig, note)


@panel_kind("optimization_history")
def optimization_history(data: ReportData, options: dict[str, Any]) -> Panel:
    """The objective of each trial in the order the trials started, and the best so far."""
    import plotly.graph_objects as go

    trials = _finished(data)
    if not trials:
        return empty("no finished trial yet")
    order = {t.run_id: i + 1 for i, t in enumerate(data.view.trials)}
    fig = go.Figure()
    for outcome, symbol, colour in ((Outcome.COMPLETED, "circle", "#1f77b4"), (Outcome.PRUNED, "x", "#ff7f0e")):
        rows = [t for t in trials if t.outcome == outcome]
        if rows:
            fig.add_trace(go.Scatter(
                x=[order[t.run_id] for t in rows], y=[round(float(t.objective), OBJECTIVE_DECIMALS) for t in rows],
                mode="markers", name=str(outcome), marker={"symbol": symbol, "size": 9, "color": colour},
                hovertext=[f"{t.name} ({t.outcome})" for t in rows], hoverinfo="text+y"))
    xs, best, ys = [], None, []
    for t in data.view.trials:
        if t.outcome == Outcome.COMPLETED and finite(t.objective) is not None:
            best = t.objective if best is None else max(best, t.objective)
        if best is not None:
            xs.append(order[t.run_id])
            ys.append(round(float(best), OBJECTIVE_DECIMALS))
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="best so far (completed)",
                                 line={"shape": "hv", "color": "#2ca02c", "width": 2}))
    fig.update_layout(height=360, xaxis={"title": "trial (in the order it started)", "tickformat": "d"},
                      yaxis_title="objective", legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"})
    return Panel(fig, "The objective of every finished trial in the order the trials started (× = pruned "
                      "early, at its last report) and the best completed one so far: a line still rising at "
                      "the end says more trials may help.")
