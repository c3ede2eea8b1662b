"""The race panel of a raced sweep (``scheduler: race``): each setting's success rate and
95% Wilson interval after every block of seeds, as the race narrowed them, ending where
the setting left (eliminated, replaced, lost at the maximum) or where it stands as the
incumbent; a table of the seeds each setting spent. Registered with `panel_kind` like
those of `service.report.panels`; `service.report.build` imports this module."""

from __future__ import annotations

from typing import Any

from service.formatting import fmt_interval
from service.report.data import ReportData
from service.report.panels import Panel, empty, panel_kind, plotly_go, short_params


@panel_kind("race")
def race(data: ReportData, options: dict[str, Any]) -> Panel | None:
    """``None`` (no panel) for a sweep that did not race."""
    if not data.raced:
        return None
    go = plotly_go()
    trials = [t for t in data.view.trials if data.race_blocks.get(t.run_id)]
    by_steps = sorted((t for t in data.view.trials if not data.race_blocks.get(t.run_id)
                       and t.race.startswith("stopped by steps")), key=lambda t: t.name)
    if not trials:
        return empty("no block of the race has been recorded yet"
                     + (f"; stopped by steps in their first block: {len(by_steps)}" if by_steps else ""))
    trials.sort(key=lambda t: (-data.race_blocks[t.run_id][-1][0], t.name))  # most seeds first
    fig = go.Figure()
    table = [["trial", "seeds", "standing", "success after its last block [95% CI]", "settings"]]
    for t in trials:
        blocks = data.race_blocks[t.run_id]
        seeds = [b[0] for b in blocks]
        rates = [b[1] for b in blocks]
        standing = t.race or "racing"
        fig.add_trace(go.Scatter(
            x=seeds, y=rates, mode="lines+markers", name=f"{t.name}: {standing}",
            error_y={"type": "data", "symmetric": False, "array": [b[3] - b[1] for b in blocks],
                     "arrayminus": [b[1] - b[2] for b in blocks]},
            hovertext=[f"{t.name} after block {i + 1}: {round(b[1] * b[0])}/{b[0]} seeds "
                       f"[{fmt_interval(b[2], b[3])}]<br>{short_params(t.params, data.searched)}"
                       for i, b in enumerate(blocks)],
            hoverinfo="text"))
        last = blocks[-1]
        table.append([t.name, str(last[0]), standing, f"{round(last[1] * last[0])}/{last[0]} "
                      f"[{fmt_interval(last[2], last[3])}]", short_params(t.params, data.searched)])
    for t in by_steps:  # no block finished: no point to draw
        table.append([t.name, "—", t.race, "—", short_params(t.params, data.searched)])
    spent = sum(data.race_blocks[t.run_id][-1][0] for t in trials)
    most = max(data.race_blocks[t.run_id][-1][0] for t in trials)
    fig.update_layout(height=420, xaxis={"title": "seeds so far (one point per block)", "rangemode": "tozero"},
                      yaxis={"range": [-0.02, 1.02], "title": "success rate (95% Wilson CI)"},
                      legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"}, margin={"t": 80})
    note = (f"Each line is a setting as the race saw it, block after block of the same seed ids: its "
            f"success rate on its seeds so far with the 95% interval. A line ends where the setting left or, "
            f"for the incumbent, at the most seeds. The race trained {spent} seed runs in all; "
            f"{most} seeds for each of these {len(trials)} settings would have been {most * len(trials)}."
            + (f" Stopped by steps inside their first block (ASHA's rule, scheduler.grace_period), with no "
               f"finished block to draw: {len(by_steps)} more (in the table)." if by_steps else ""))
    return Panel(fig, note, table)
