"""The report's panel kinds. A panel kind is a function ``(data, options) -> Panel``
registered with ``@panel_kind("name")``; `dashboards/report.yaml` says which panels a
report shows, in which order, with which options (metrics, how many settings). A kind
that does not apply to a sweep (test lengths of a static task) returns ``None`` and the
report leaves it out, rather than showing an empty plot that says so.

To add a panel: write a function here (or in any module imported below) that returns a
plotly figure, register it, and list it in the dashboard file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from service.formatting import finite, fmt_interval, fmt_number, fmt_param
from service.report.data import ReportData
from service.scoring.metrics import wilson_interval
from service.tracking.pooled import provenance
from service.tracking.store import Outcome

PANEL_KINDS: dict[str, Callable[[ReportData, dict[str, Any]], "Panel | None"]] = {}


@dataclass
class Panel:
    figure: Any  # a plotly Figure
    note: str = ""  # a short reading guide / what is missing, shown under the plot
    table: list[list[str]] = field(default_factory=list)  # optional rows (first row: header)


def panel_kind(name: str):
    def register(fn):
        PANEL_KINDS[name] = fn
        return fn
    return register


def plotly_go():
    import plotly.graph_objects as go

    return go


def empty(message: str) -> Panel:
    """A placeholder figure (so every panel still has a plot) saying why it is empty."""
    go = plotly_go()
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font={"size": 14})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=220)
    return Panel(fig, message)


def short_params(params: dict[str, str], searched: list[str]) -> str:
    parts = []
    for name in searched:
        if name in params:
            parts.append(f"{name}={fmt_param(params[name])}")
    return ", ".join(parts)


# how the terminal shows these: the objective to 4 decimals (its tie-breakers are far
# below that), steps and seed counts as integers
METRIC_FORMATS = {"objective": ".4f", "solved_at_median": ".0f", "diverged": ".0f", "successes": ".0f",
                  "n_seeds": ".0f"}


def metric_cell(metrics: dict[str, float], name: str) -> str:
    return fmt_number(metrics.get(name), METRIC_FORMATS.get(name, ".3g"))


def _ci_of(metrics: dict[str, float]) -> tuple[float, float, float] | None:
    rate = finite(metrics.get("success_rate"))
    if rate is None:
        return None
    low, high = finite(metrics.get("success_ci_low")), finite(metrics.get("success_ci_high"))
    if low is None or high is None:
        n, k = metrics.get("n_seeds"), metrics.get("successes")
        if n:
            low, high = wilson_interval(int(k or 0), int(n))
        else:
            low = high = rate
    return rate, low, high


@panel_kind("ranking_forest")
def ranking_forest(data: ReportData, options: dict[str, Any]) -> Panel:
    """Settings by objective, each with success rate and 95% Wilson CI (search, and the
    fresh-seed validation next to it when there is one)."""
    go = plotly_go()
    top = int(options.get("top", 15))
    rows = data.ranked(top)
    if not rows:
        return empty("no finished trial to rank yet")
    labels = [f"#{i + 1} {t.name}" for i, t in enumerate(rows)]
    fig = go.Figure()
    for source, color, get in (("search", "#1f77b4", lambda t: t.metrics),
                               ("validation (fresh seeds)", "#d62728",
                                lambda t: data.validations[t.run_id].metrics if t.run_id in data.validations else None)):
        xs, lo, hi, ys, hover = [], [], [], [], []
        for label, t in zip(labels, rows):
            metrics = get(t)
            ci = _ci_of(metrics) if metrics else None
            if ci is None:
                continue
            rate, low, high = ci
            xs.append(rate)
            lo.append(rate - low)
            hi.append(high - rate)
            ys.append(label)
            pooled = provenance(metrics)
            hover.append(f"{label}<br>{short_params(t.params, data.searched)}<br>"
                         f"{int(metrics.get('successes', 0))}/{int(metrics.get('n_seeds', 0))} seeds "
                         f"[{fmt_interval(low, high)}]" + (f"<br>{pooled}" if pooled else ""))
        if xs:
            # orientation "h": the settings (y) are the position axis, so "group" puts the
            # search and validation points of a setting side by side in its row; with the
            # default "v" plotly shifted them along the rate axis instead, away from their rates
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="markers", name=source, marker={"color": color, "size": 9},
                orientation="h", cliponaxis=False,
                error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
                hovertext=hover, hoverinfo="text"))
    fig.update_layout(height=max(260, 48 * len(rows) + 120), xaxis_title="success rate (95% Wilson CI)",
                      xaxis={"range": [-0.05, 1.05]}, yaxis={"autorange": "reversed", "type": "category"},
                      legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
                      margin={"l": 170, "t": 50}, scattermode="group")
    metrics = options.get("metrics", ["objective", "solved_at_median", "sparsity_error_mean",
                                          "final_sparsity_error_mean", "diverged"])
    header = ["rank", "trial", "outcome", *metrics, "validation", "settings"]
    table = [header]
    for label, t in zip(labels, rows):
        v = data.validations.get(t.run_id)
        vtext = "—"
        if v is not None:
            ci = _ci_of(v.metrics)
            pooled = provenance(v.metrics)
            vtext = (f"{int(v.metrics.get('successes', 0))}/{int(v.metrics.get('n_seeds', 0))} "
                     f"[{fmt_interval(ci[1], ci[2])}]" + (f" {pooled}" if pooled else "")) if ci else "—"
        table.append([label.split()[0], t.name, t.outcome, *[metric_cell(t.metrics, m) for m in metrics], vtext,
                      short_params(t.params, data.searched)])
    return Panel(fig, "Ranked by the objective (lower end of the 95% Wilson interval). A setting is robust when "
                      "its interval is high and narrow, and the validation interval agrees. A setting validated "
                      "more than once shows its validations pooled (disjoint fresh seeds, one sample).", table)


def _params_for_importance(data: ReportData):
    """(distributions, trials) for an in-memory Optuna study rebuilt from the sweep."""
    import optuna
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    from service.search.assign import typed_params
    from service.search.space import CategoricalParam, IntParam, LogUniformParam

    space = data.space
    dists = {}
    for name, p in space.params.items():
        if isinstance(p, CategoricalParam):
            dists[name] = CategoricalDistribution([str(x) if not isinstance(x, (int, float, str, bool)) else x
                                                   for x in p.labels])
        elif isinstance(p, IntParam):
            dists[name] = IntDistribution(p.low, p.high, step=p.step, log=p.log)
        elif isinstance(p, LogUniformParam):
            dists[name] = FloatDistribution(p.low, p.high, log=True)
        else:
            dists[name] = FloatDistribution(p.low, p.high, step=p.step)
    trials = []
    for t in data.view.trials:
        if t.outcome not in (Outcome.COMPLETED, Outcome.PRUNED) or finite(t.objective) is None:
            continue
        try:
            values = typed_params(space, t.params)
        except Exception:  # noqa: BLE001
            continue
        trials.append(optuna.trial.create_trial(
            params=values, distributions={k: dists[k] for k in values}, value=float(t.objective)))
    return trials


@panel_kind("importance")
def importance(data: ReportData, options: dict[str, Any]) -> Panel:
    """Optuna's hyperparameter importance on the sweep's trials (rebuilt as a study)."""
    import optuna

    go = plotly_go()
    if data.space is None or not data.space.params:
        return empty("no searched parameters")
    trials = _params_for_importance(data)
    if len(trials) < 2:
        return empty(f"importance needs at least 2 finished trials ({len(trials)} so far)")
    if len({t.value for t in trials}) < 2:
        return empty("every finished trial has the same objective: no parameter explains anything")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.add_trials(trials)
    name = options.get("evaluator", "fanova")
    evaluators = {
        "fanova": lambda: optuna.importance.FanovaImportanceEvaluator(seed=0),
        "mean_decrease_impurity": lambda: optuna.importance.MeanDecreaseImpurityImportanceEvaluator(seed=0),
        "ped_anova": lambda: optuna.importance.PedAnovaImportanceEvaluator(),
    }
    try:
        result = optuna.importance.get_param_importances(study, evaluator=evaluators[name]())
    except Exception as e:  # noqa: BLE001 - too few trials, conditional parameters everywhere, ...
        return empty(f"Optuna could not compute importances: {e}"[:200])
    if not result:
        return empty("no parameter is present in every finished trial")
    names = list(result)[::-1]
    enough = int(options.get("min_trials", 20))
    few = len(trials) < enough
    fig = go.Figure(go.Bar(x=[result[n] for n in names], y=names, orientation="h",
                           marker={"color": "#bbbbbb" if few else "#2ca02c"}))
    fig.update_layout(height=max(220, 40 * len(names) + 100), xaxis_title=f"importance ({name})")
    warning = ""
    if few:
        warning = (f"Unreliable: only {len(trials)} finished trials (fewer than {enough}); with so few the "
                   "importances are mostly noise. ")
        fig.update_layout(title={"text": f"⚠ only {len(trials)} trials: unreliable", "font": {"color": "#b00020"}})
    return Panel(fig, f"{warning}Optuna's {name} importance of each parameter for the objective, over "
                      f"{len(trials)} finished trials (completed and pruned). Parameters present only "
                      "conditionally are left out.")


def _colour_key(data: ReportData, options: dict[str, Any]) -> tuple[str, Callable[[Any], str]]:
    """Which categorical to colour by: a searched unit / gate parameter, else the fixed units."""
    from service.search.space import CategoricalParam

    words = options.get("colour_by", ["unit", "gate", "weights"])
    if data.space is not None:
        for name, p in data.space.params.items():
            targets = " ".join(p.targets(name)) if not getattr(p, "is_preset", False) else name
            if isinstance(p, CategoricalParam) and any(w in name or w in targets for w in words):
                return name, lambda t, n=name: t.params.get(n, "(inactive)")
        layers = (data.space.fixed.get("model") or {}).get("layers") or []
        units = " → ".join(str(layer.get("unit", "?")) for layer in layers if isinstance(layer, dict)) or "default"
        return "unit", lambda t: units
    return "unit", lambda t: "?"


@panel_kind("success_vs_params")
def success_vs_params(data: ReportData, options: dict[str, Any]) -> Panel:
    """Success rate against each searched parameter, one subplot each, coloured by unit/gate."""
    from plotly.subplots import make_subplots

    from service.search.space import CategoricalParam, LogUniformParam

    go = plotly_go()
    names = data.searched
    metric = options.get("metric", "success_rate")
    trials = [t for t in data.view.trials if finite(t.metrics.get(metric)) is not None]
    if not names or not trials:
        return empty("no searched parameter or no finished trial")
    key, colour = _colour_key(data, options)
    cols = min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig = make_subplots(rows=nrows, cols=cols, subplot_titles=names)
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    groups = sorted({colour(t) for t in trials})
    for i, name in enumerate(names):
        r, c = i // cols + 1, i % cols + 1
        for g, group in enumerate(groups):
            rows = [t for t in trials if colour(t) == group and name in t.params]
            if not rows:
                continue
            x = [t.params[name] for t in rows]
            p = data.space.params.get(name) if data.space else None
            if p is not None and not isinstance(p, CategoricalParam):
                x = [finite(v) for v in x]
            fig.add_trace(go.Scatter(
                x=x, y=[t.metrics[metric] for t in rows], mode="markers", name=f"{key}={group}",
                legendgroup=group, showlegend=i == 0 and len(groups) > 1,
                marker={"color": palette[g % len(palette)], "size": 9,
                        "symbol": ["circle" if t.outcome == Outcome.COMPLETED else "x" for t in rows]},
                hovertext=[f"{t.name} ({t.outcome})" for t in rows], hoverinfo="text+x+y"), row=r, col=c)
        if p is not None and isinstance(p, LogUniformParam):
            fig.update_xaxes(type="log", row=r, col=c)
        if p is not None and isinstance(p, CategoricalParam):
            fig.update_xaxes(type="category", row=r, col=c)
        fig.update_yaxes(range=[-0.05, 1.05], row=r, col=c)
    fig.update_layout(height=300 * nrows + 80, legend={"orientation": "h", "y": -0.12})
    colours = f"colour: {key}." if len(groups) > 1 else f"every trial has {key}={groups[0]}."
    return Panel(fig, f"Each point is a trial ({metric}; × = pruned early by ASHA, at its last report); {colours}")


@panel_kind("extrapolation_mse")
def extrapolation_mse(data: ReportData, options: dict[str, Any]) -> Panel:
    """Median extrapolation MSE per range for the top settings (search and validation)."""
    go = plotly_go()
    rows = data.ranked(int(options.get("top", 5)))
    ranges = data.ranges()
    if not rows or not ranges:
        return empty("no extrapolation metrics logged yet")
    thresholds = data.thresholds()
    fig = go.Figure()
    for i, t in enumerate(rows):
        for source, metrics in (("search", t.metrics),
                                ("validation", data.validations[t.run_id].metrics if t.run_id in data.validations else None)):
            if metrics is None:
                continue
            ys = [finite(metrics.get(f"extrapolation_mse_median.{r}")) for r in ranges]
            if all(y is None for y in ys):
                continue
            fig.add_trace(go.Bar(x=ranges, y=ys, name=f"#{i + 1} {t.name} ({source})",
                                 text=[near_miss(y, thresholds.get(r)) for y, r in zip(ys, ranges)],
                                 textposition="outside",
                                 marker={"pattern": {"shape": "/" if source == "validation" else ""}}))
    shown = [r for r in ranges if thresholds.get(r)]
    if shown:
        fig.add_trace(go.Scatter(x=shown, y=[thresholds[r] for r in shown], mode="markers",
                                 name="success threshold", marker={"symbol": "line-ew-open", "size": 90,
                                                                   "line": {"width": 3, "color": "#d62728"}}))
    fig.update_layout(barmode="group", yaxis={"type": "log", "title": "median extrapolation MSE"},
                      xaxis_title="extrapolation range", height=380)
    return Panel(fig, "Median over seeds of each seed's extrapolation MSE at its best interpolation step; "
                      "log scale; the red line is the success threshold of the range, and a bar up to 10× "
                      "above it is labelled with how far (×1.17: a near miss). Ranges added by "
                      "`validate --range` appear only for validation runs.")


def near_miss(value: float | None, threshold: float | None, within: float = 10.0) -> str:
    """``×1.17`` for a value above its threshold by less than ``within`` times, else ``""``."""
    if value is None or not threshold or not threshold > 0:
        return ""
    ratio = value / threshold
    return f"×{ratio:.2f}" if 1.0 < ratio < within else ""


@panel_kind("solved_at")
def solved_at(data: ReportData, options: dict[str, Any]) -> Panel:
    """Distribution of solved_at (solved seeds only) for the top settings."""
    go = plotly_go()
    rows = data.ranked(int(options.get("top", 5)))
    fig = go.Figure()
    count = 0
    for i, t in enumerate(rows):
        for source, seeds in (("search", data.seeds.get(t.run_id, [])),
                              ("validation", data.validations[t.run_id].seeds if t.run_id in data.validations else [])):
            values = [finite(s.get("solved_at")) for s in seeds]
            values = [v for v in values if v is not None]
            if not values:
                continue
            count += len(values)
            fig.add_trace(go.Box(y=values, name=f"#{i + 1} {t.name} ({source})", boxpoints="all", jitter=0.4))
    if not count:
        return empty("no seed of the top settings solved the task")
    fig.update_layout(yaxis={"title": "solved_at (training step)", "tickformat": ",d"}, height=380, showlegend=False)
    return Panel(fig, "One point per solved seed: the first evaluation step at which it was below the "
                      "success threshold. Failed seeds have no solved_at and are not shown.")


@panel_kind("weights")
def weights(data: ReportData, options: dict[str, Any]) -> Panel:
    """Heatmaps of the learned weight matrices of a successful and a failed seed."""
    from plotly.subplots import make_subplots

    go = plotly_go()
    if not data.weights:
        return empty("no weights logged for the top setting")
    roles = [r for r in ("best", "failed") if r in data.weights]
    names = list(data.weights[roles[0]].get("weights", {}))
    if not names:
        return empty("no weights logged for the top setting")
    titles = []
    for role in roles:
        w = data.weights[role]
        state = "succeeded" if w.get("success") else ("diverged" if w.get("diverged") else "failed")
        if state == "failed":
            ratios = [finite(w.get("extrapolation_mse", {}).get(r)) for r in w.get("thresholds", {})]
            worst = max(((v or math.inf) / w["thresholds"][r] for v, r in zip(ratios, w.get("thresholds", {}))
                         if w["thresholds"][r]), default=None)
            if worst is not None and math.isfinite(worst):
                state = f"failed: MSE ×{worst:.2f} the threshold"
        titles += [f"{role} seed {w.get('seed')} ({state}) · {n}" for n in names]
    fig = make_subplots(rows=len(roles), cols=len(names), subplot_titles=titles)
    for i, role in enumerate(roles):
        for j, n in enumerate(names):
            z = data.weights[role]["weights"].get(n) or [[None]]
            text = [[fmt_number(v, ".2f") if v is not None else "" for v in row] for row in z]
            fig.add_trace(go.Heatmap(z=z, zmin=-1, zmax=1, colorscale="RdBu", reversescale=True,
                                     text=text, texttemplate="%{text}" if sum(map(len, z)) <= 400 else "",
                                     showscale=(i == 0 and j == 0)), row=i + 1, col=j + 1)
            fig.update_yaxes(autorange="reversed", row=i + 1, col=j + 1)
    fig.update_layout(height=280 * len(roles) + 80)
    note = f"From the {data.weights_source}. Sparse ±1 / 0 weights are what an exact solution looks like."
    if "failed" not in data.weights:
        note += " Every seed succeeded: there is no failed seed to show."
    return Panel(fig, note)


