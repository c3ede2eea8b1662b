"""Build the report of a sweep: a self-contained HTML file (plotly.js embedded, no network)
and one PNG per panel, saved locally and logged as artifacts of the sweep's parent run."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.errors import UserError
from service.formatting import finite
from service.report import race_panels, search_panels, sequence_panels  # noqa: F401 - register their panel kinds
from service.report.data import ReportData, load_report_data
from service.report.panels import PANEL_KINDS, Panel, empty, short_params
from service.scoring.verdict import best_of_validated
from service.tracking.best import judge, setting_params
from service.tracking.pooled import parts, provenance
from service.tracking.store import Outcome
from service.yamlio import load_mapping

# package data: a link to dashboards/report.yaml in the checkout, the file itself in the wheel
DEFAULT_DASHBOARD = Path(__file__).resolve().parent / "dashboard.yaml"
ARTIFACT_DIR = "report"


@dataclass
class PanelSpec:
    id: str
    kind: str
    title: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Dashboard:
    title: str
    top: int
    panels: list[PanelSpec]


def _options(path: Path, i: int, options: Any) -> dict[str, Any]:
    if options is not None and not isinstance(options, dict):
        raise UserError(f"{path}: panels.{i}.options: a mapping (key: value), not {type(options).__name__}")
    return dict(options or {})


def load_dashboard(path: Path | None = None) -> Dashboard:
    path = Path(path) if path else DEFAULT_DASHBOARD
    raw = load_mapping(path)
    top = raw.get("top", 5)
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= 1000:
        raise UserError(f"{path}: top: a whole number from 1 to 1000 (got {top!r})")
    if not isinstance(raw.get("panels") or [], list):
        raise UserError(f"{path}: panels: a list of panels, each with a 'kind'")
    panels = []
    for i, item in enumerate(raw.get("panels") or []):
        if not isinstance(item, dict) or "kind" not in item:
            raise UserError(f"{path}: panels.{i}: needs a 'kind'")
        if item["kind"] not in PANEL_KINDS:
            raise UserError(f"{path}: panels.{i}.kind: unknown panel kind {item['kind']!r}; "
                            f"known: {', '.join(sorted(PANEL_KINDS))}")
        panels.append(PanelSpec(str(item.get("id", item["kind"])), item["kind"],
                                str(item.get("title", item["kind"])), _options(path, i, item.get("options"))))
    if not panels:
        raise UserError(f"{path}: no panels")
    return Dashboard(str(raw.get("title", "nalu-sweep report: {name}")), top, panels)


# -- the plain-language summary ------------------------------------------------------------------------
def _rate(metrics: dict[str, float]) -> str:
    k, n = int(metrics.get("successes", 0)), int(metrics.get("n_seeds", 0))
    low, high = finite(metrics.get("success_ci_low")), finite(metrics.get("success_ci_high"))
    from service.formatting import fmt_interval

    ci = fmt_interval(low, high, "–")
    ci = f" [95% CI {ci}]" if ci else ""
    return f"{k} of {n} seeds{ci}"


def choice_sentence(data: ReportData) -> str | None:
    """`verdict.best_of_validated` for the sweep's validated settings (None for fewer than two)."""
    ranked = data.ranked(1)
    if not ranked:
        return None
    names = {t.run_id: t.name for t in data.view.trials}
    judged = ranked[0].name if ranked[0].run_id in data.validations else None
    return best_of_validated([(names.get(source, v.name), v.metrics) for source, v in data.validations.items()],
                             judged)


def summary_lines(data: ReportData) -> list[str]:
    """Plain sentences for the top of the report."""
    view = data.view
    c = view.counts()
    lines = [f"Sweep {view.name} ({view.outcome or view.status.lower()}): {len(view.trials)} trials — "
             f"{c['completed']} completed, {c['pruned']} pruned early by ASHA, {c['failed']} failed, "
             f"{c['running']} running, {c['interrupted']} interrupted."]
    ranked = data.ranked()
    if not ranked:
        lines.append("No trial has finished yet, so there is no setting to recommend.")
    else:
        best = ranked[0]
        params = short_params(best.params, data.searched) or "(no searched parameters)"
        ranges = ", ".join(data.ranges()) or "the task's extrapolation range"
        text = f"The most robust setting found is {params} ({best.name})"
        if best.outcome != Outcome.COMPLETED:
            text += ", which was pruned before the end (no trial completed)"
        text += f"; during the search it succeeded on {_rate(best.metrics)}"
        val = data.validations.get(best.run_id)
        if val is not None:
            ranges = ", ".join(r for r in data.ranges() if f"extrapolation_mse_median.{r}" in val.metrics) or ranges
            pooled = provenance(val.metrics)
            text += (f", and on {_rate(val.metrics).replace('seeds', 'fresh seeds')} (seed ids {val.seed_ids}, "
                     f"never used in the search{'; ' + pooled + ', pooled' if pooled else ''}) "
                     f"across these ranges: {ranges}.")
        else:
            text += (f" across {ranges}. It has not been validated on fresh seeds yet: run "
                     f"`nalu-sweep validate {view.name}` — the best of a search is optimistically biased.")
        lines.append(text)
        judged = judge(best, val.metrics if val else None)
        if judged is not None:
            lines.append(judged.sentence())
        if choice := choice_sentence(data):
            lines.append(choice)
    diverged = data.diverged_trials()
    if diverged:
        seeds = sum(int(t.metrics.get("diverged", 0)) for t in diverged)
        lines.append(f"{len(diverged)} trial(s) had diverged seeds (NaN/inf; {seeds} seeds in all), "
                     "counted as failures.")
    if c["pruned"]:
        lines.append(f"{c['pruned']} trial(s) were pruned early; their metrics are from their last report "
                     "and they are ranked only when no trial completed.")
    if c["failed"]:
        lines.append(f"{c['failed']} trial(s) failed with an error (see the nalu_sweep.error tag in MLflow).")
    return lines


def _interval(metrics: dict[str, float] | None) -> dict[str, Any] | None:
    if not metrics or "success_rate" not in metrics:
        return None
    n = metrics.get("n_seeds")
    return {"successes": int(metrics.get("successes", 0)), "n": int(n) if n is not None else None,
            "rate": finite(metrics.get("success_rate")), "ci_low": finite(metrics.get("success_ci_low")),
            "ci_high": finite(metrics.get("success_ci_high"))}


def summary_fields(data: ReportData) -> dict[str, Any]:
    """The summary as fields: counts, the best trial, its parameters, its search and
    validation successes with their 95% intervals, and the verdict (``None`` where unknown)."""
    view = data.view
    ranked = data.ranked()
    best = ranked[0] if ranked else None
    val = data.validations.get(best.run_id) if best else None
    judged = judge(best, val.metrics if val else None) if best else None
    return {
        "sweep": view.name, "outcome": view.outcome or view.status.lower(), "trials": view.counts(),
        "best": None if best is None else {
            "trial": best.name, "run_id": best.run_id, "run_name": best.run_name, "outcome": best.outcome,
            "objective": finite(best.objective), "params": setting_params(best, data.searched or None),
        },
        "search": _interval(best.metrics) if best else None,
        "validation": None if val is None else {**(_interval(val.metrics) or {}), "run_id": val.run_id,
                                                "seed_ids": val.seed_ids, "run_ids": val.run_ids,
                                                "seeds_per_validation": parts(val.metrics) or [
                                                    int(val.metrics.get("n_seeds", 0))]},
        "verdict": None if judged is None else {"key": judged.key, "words": judged.words,
                                                "ci_low": judged.ci_low, "validated": judged.validated},
    }


# -- outputs ------------------------------------------------------------------------------------------------
def _json(obj: Any) -> str:
    from plotly.utils import PlotlyJSONEncoder

    return json.dumps(obj, cls=PlotlyJSONEncoder).replace("</", "<\\/")


def render_html(data: ReportData, dashboard: Dashboard, panels: list[tuple[PanelSpec, Panel]],
                png_names: dict[str, str]) -> str:
    from plotly.offline import get_plotlyjs

    title = dashboard.title.format(name=data.view.name)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em;color:#222}"
        ".summary{background:#f4f6fa;border-left:4px solid #1f77b4;padding:.6em 1em}"
        ".panel{margin:2em 0}.note{color:#555;font-size:.9em}"
        "table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ccc;padding:2px 6px}"
        "</style>",
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<div class='summary' id='summary'>" + "".join(f"<p>{html.escape(line)}</p>"
                                                        for line in summary_lines(data)) + "</div>",
    ]
    scripts = []
    for spec, panel in panels:
        div = f"plot-{spec.id}"
        parts.append(f"<div class='panel' id='panel-{html.escape(spec.id)}'><h2>{html.escape(spec.title)}</h2>"
                     f"<div class='plot' id='{div}'></div>")
        if panel.note:
            parts.append(f"<p class='note'>{html.escape(panel.note)}</p>")
        if panel.table:
            head, *body = panel.table
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
                         + "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                                   for row in body) + "</table>")
        if spec.id in png_names:
            parts.append(f"<p class='note'>static image: <a href='{png_names[spec.id]}'>{png_names[spec.id]}</a></p>")
        parts.append("</div>")
        fig = panel.figure.to_plotly_json()
        scripts.append(f"Plotly.newPlot('{div}', {_json(fig.get('data', []))}, {_json(fig.get('layout', {}))}, "
                       "{responsive: true, displaylogo: false});")
    parts.append("<script type='text/javascript'>" + "\n".join(scripts) + "</script></body></html>")
    return "\n".join(parts)


def figure_png(panel: Panel, title: str, path: Path) -> Path:
    """A static matplotlib rendering of a panel's plotly figure, saved as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = static_figure(panel, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def static_figure(panel: Panel, title: str) -> Any:
    """A matplotlib figure of a panel's plotly figure (scatter with error bars, bars,
    boxes, heatmaps; one axes per plotly subplot), its y axis reversed where plotly's is
    (the ranking: the best setting on top, as in the interactive chart)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig_json = panel.figure.to_plotly_json()
    traces = fig_json.get("data", [])
    layout = fig_json.get("layout", {})
    keys = []
    for t in traces:
        key = (t.get("xaxis", "x"), t.get("yaxis", "y"))
        if key not in keys:
            keys.append(key)
    if not traces:
        fig, ax = plt.subplots(figsize=(8, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, panel.note or "(empty)", ha="center", va="center", wrap=True)
    else:
        cols = min(3, len(keys))
        rows = math.ceil(len(keys) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
        for ax in axes.ravel()[len(keys):]:
            ax.axis("off")
        titles = [a.get("text", "") for a in layout.get("annotations", [])]
        for i, key in enumerate(keys):
            ax = axes.ravel()[i]
            if i < len(titles) and len(keys) > 1:
                ax.set_title(titles[i], fontsize=8)
            box_i = 0
            for t in traces:
                if (t.get("xaxis", "x"), t.get("yaxis", "y")) != key:
                    continue
                kind = t.get("type", "scatter")
                x = list(t.get("x") or [])
                y = list(t.get("y") or [])
                label = t.get("name")
                if kind == "parcoords":
                    _parcoords_png(ax, t)
                elif kind == "heatmap":
                    z = np.array([[np.nan if v is None else v for v in row] for row in t.get("z", [[0]])], float)
                    ax.imshow(z, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
                elif kind == "bar":
                    if t.get("orientation") == "h":
                        ax.barh([str(v) for v in y], x, label=label)
                    else:
                        ax.bar([str(v) for v in x], [np.nan if v is None else v for v in y], label=label, alpha=0.7)
                elif kind == "box":
                    ax.boxplot([v for v in y if v is not None], positions=[box_i], widths=0.5)
                    box_i += 1
                else:
                    err = t.get("error_x") or {}
                    xv = [str(v) if isinstance(v, str) else (np.nan if v is None else v) for v in x]
                    yv = [str(v) if isinstance(v, str) else v for v in y]
                    if err.get("array") is not None:
                        ax.errorbar(xv, yv, xerr=[err.get("arrayminus"), err.get("array")], fmt="o", label=label,
                                    capsize=3)
                    else:
                        ax.plot(xv, yv, "o", label=label, alpha=0.8)
            if any(t.get("type") == "bar" and t.get("orientation") != "h" for t in traces) and \
                    (layout.get("yaxis") or {}).get("type") == "log":
                ax.set_yscale("log")
            if ((layout.get("yaxis") or {}).get("autorange") == "reversed" and len(keys) == 1
                    and all(t.get("type", "scatter") == "scatter" for t in traces)):
                ax.invert_yaxis()  # categories go up from the first in matplotlib (an image is already top-down)
            handles, _ = ax.get_legend_handles_labels()
            if handles and i == 0:
                ax.legend(fontsize=7)
            ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _parcoords_png(ax: Any, trace: dict[str, Any]) -> None:
    """Parallel coordinates in matplotlib: every axis scaled to [0, 1], one line a trial."""
    import numpy as np

    dims = trace.get("dimensions") or []
    if not dims:
        return
    cols = []
    for d in dims:
        v = np.asarray(d.get("values") or [], float)
        span = float(np.ptp(v)) if v.size else 0.0
        cols.append((v - v.min()) / span if span > 0 else np.full_like(v, 0.5))
    lines = np.vstack(cols).T
    colour = np.asarray((trace.get("line") or {}).get("color") or [0] * len(lines), float)
    span = float(np.ptp(colour)) or 1.0
    for row, c in zip(lines, colour):
        ax.plot(range(len(dims)), row, color=matplotlib_colour((c - colour.min()) / span), alpha=0.7)
    ax.set_xticks(range(len(dims)), [d.get("label", "") for d in dims], rotation=20)
    ax.set_yticks([])


def matplotlib_colour(fraction: float) -> Any:
    import matplotlib

    return matplotlib.colormaps["viridis"](fraction)


@dataclass
class ReportFiles:
    html: Path
    pngs: list[Path]
    logged_to: str | None
    data: ReportData


def build_report(tracking_uri: str, name: str, out_dir: Path, dashboard_file: Path | None = None,
                 log_to_mlflow: bool = True, pngs: bool = True) -> ReportFiles:
    """Read the sweep, render every panel of the dashboard, write ``report.html`` and the
    PNGs into ``out_dir`` and log them under ``report/`` of the sweep's parent run."""
    dashboard = load_dashboard(dashboard_file)
    data = load_report_data(tracking_uri, name, top=dashboard.top)
    if data is None:
        raise UserError(f"no sweep named {name!r} in {tracking_uri}")
    panels = []
    for spec in dashboard.panels:
        try:
            panel = PANEL_KINDS[spec.kind](data, spec.options)
        except Exception as e:  # noqa: BLE001 - one broken panel must not lose the report
            panel = empty(f"this panel failed: {type(e).__name__}: {e}"[:300])
        if panel is not None:  # None: the panel does not apply to this sweep
            panels.append((spec, panel))
    out_dir.mkdir(parents=True, exist_ok=True)
    png_files: list[Path] = []
    png_names: dict[str, str] = {}
    if pngs:
        for spec, panel in panels:
            try:
                png_files.append(figure_png(panel, spec.title, out_dir / f"{spec.id}.png"))
                png_names[spec.id] = f"{spec.id}.png"
            except Exception:  # noqa: BLE001 - the HTML is the report; a PNG is a convenience
                continue
    page = out_dir / "report.html"
    page.write_text(render_html(data, dashboard, panels, png_names), encoding="utf-8")
    lines = summary_lines(data)
    (out_dir / "summary.json").write_text(json.dumps({**summary_fields(data), "summary": lines}, indent=1))
    logged = None
    if log_to_mlflow:
        from service.tracking import store
        from service.tracking.best import record_best

        client = store.client(tracking_uri)
        for f in [page, out_dir / "summary.json", *png_files]:
            store.retry(lambda f=f: client.log_artifact(data.view.run_id, str(f), ARTIFACT_DIR))
        logged = f"runs:/{data.view.run_id}/{ARTIFACT_DIR}"
        ranked = data.ranked()
        val = data.validations.get(ranked[0].run_id) if ranked else None
        record_best(client, data.view.run_id, name, data.view.trials, val.metrics if val else None,
                    extra=[f"The report: artifact `{ARTIFACT_DIR}/report.html` of this run.", *lines[1:]],
                    report=f"{ARTIFACT_DIR}/report.html")
    return ReportFiles(page, png_files, logged, data)
