"""The report verbs of `nalu-sweep`: ``report``, ``validate`` and ``compare``.

Registered on the `service.cli` app; heavy imports (Ray, MLflow, plotly) happen inside.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from service.cli.app import app, console, fail
from service.cli.common import (
    ADDRESS_HELP,
    TRACKING_HELP,
    open_client,
    print_wide,
    require_sweeps,
    success_cell,
    tracking_uri_of,
)
from service.errors import UserError
from service.formatting import MISSING, fmt_number, fmt_param
from service.names import require_sweep_name


@app.command()
def report(
    name: str = typer.Argument(..., help="The sweep name."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Directory for report.html and the PNGs (default: ./reports/NAME)."),
    dashboard: Optional[Path] = typer.Option(None, help="Panel definitions (default: the shipped dashboards/report.yaml)."),
    no_log: bool = typer.Option(False, "--no-log", help="Do not log the report to the sweep's MLflow parent run."),
    tracking_uri: Optional[str] = typer.Option(None, help=TRACKING_HELP),
) -> None:
    """A self-contained HTML report (works offline) plus PNGs: ranking with 95% CIs,
    parameter importance, success against each parameter, extrapolation MSE, solved_at,
    learned weights, and validation on fresh seeds next to search-time success."""
    try:
        require_sweep_name(name, "NAME")
        uri = tracking_uri_of(tracking_uri, must_exist=True)
        require_sweeps(uri, name)
        from service.report.build import build_report

        out = output or Path("reports") / name
        files = build_report(uri, name, out, dashboard, log_to_mlflow=not no_log)
    except UserError as e:
        fail(str(e))
    from service.report.build import summary_lines

    for line in summary_lines(files.data):
        console.print(line, highlight=False)
    console.print(f"report: [bold]{files.html.resolve()}[/] ({len(files.pngs)} PNGs)", highlight=False)
    if files.logged_to:
        from service.cli.decision import print_sweep_links

        console.print(f"logged to MLflow: {files.logged_to}", highlight=False)
        print_sweep_links(uri, files.data.view, report=True)


@app.command()
def validate(
    name: str = typer.Argument(..., help="The sweep name."),
    top: int = typer.Option(3, min=1, help="How many of the best settings to re-run."),
    seeds: int = typer.Option(32, min=1, help="Fresh seeds per setting (ids never used by the sweep)."),
    range_: List[str] = typer.Option([], "--range", help="An extra extrapolation range NAME=RANGE, e.g. far=U[6,20] (repeatable)."),
    include_pruned: bool = typer.Option(False, "--include-pruned", help="Also consider trials ASHA stopped early."),
    address: Optional[str] = typer.Option(None, help=ADDRESS_HELP),
    tracking_uri: Optional[str] = typer.Option(None, help=TRACKING_HELP),
) -> None:
    """Re-run the top K settings on S fresh seeds (disjoint from every seed the sweep used)
    on every extrapolation range of the task, as Ray tasks; each becomes a validation child
    run of the sweep's parent run. `nalu-sweep report` then shows both side by side."""
    try:
        require_sweep_name(name, "NAME")
        from service.endpoints import check_ray_address

        uri = tracking_uri_of(tracking_uri, must_exist=True)
        require_sweeps(uri, name)
        check_ray_address(address)
        from service.sweep.validation import parse_ranges, validate_sweep

        extra = parse_ranges(range_)
        console.print(f"validating the top {top} settings of {name} on {seeds} fresh seeds each", highlight=False)
        results = validate_sweep(uri, name, top, seeds, extra, address=address, include_pruned=include_pruned,
                                 say=lambda line: console.print(line, highlight=False))
        from service.tracking.queries import load_sweep, validated_metrics

        client = open_client(uri)
        view = load_sweep(client, name)
        pooled = validated_metrics(client, view)  # with the setting's earlier validations
    except UserError as e:
        fail(str(e))
    from service.tracking.pooled import parts

    earlier = any(len(parts(pooled.get(r.source_run_id, {}))) > 1 for r in results)
    table = Table(title=f"validation of {name} (fresh seeds {results[0].seed_ids[0]}–{results[0].seed_ids[-1]})")
    for col in ("trial", "search success [95% CI]", "validation success [95% CI]",
                *(["every validation, pooled"] if earlier else []), "validation run"):
        table.add_column(col)
    for r in results:
        table.add_row(r.source_name, success_cell(r.search_metrics), success_cell(r.metrics),
                      *([success_cell(pooled.get(r.source_run_id, r.metrics))] if earlier else []), r.run_id)
    print_wide(table)
    from service.scoring.verdict import best_of_validated

    ranked = view.ranked() if view is not None else []
    choice = best_of_validated([(r.source_name, pooled.get(r.source_run_id, r.metrics)) for r in results],
                               ranked[0].name if ranked else None)
    if choice:
        console.print(choice, highlight=False)
    console.print(f"now: [bold]nalu-sweep report {name}[/]", highlight=False)


@app.command()
def compare(
    name1: str = typer.Argument(..., help="First sweep."),
    name2: str = typer.Argument(..., help="Second sweep."),
    top: int = typer.Option(3, min=1, help="Best settings of each sweep to show."),
    tracking_uri: Optional[str] = typer.Option(None, help=TRACKING_HELP),
) -> None:
    """Two sweeps' best settings side by side (search and, when run, validation success)."""
    try:
        require_sweep_name(name1, "NAME1")
        require_sweep_name(name2, "NAME2")
        if name1 == name2:  # its rows would only be printed twice
            raise UserError(f"compare needs two different sweeps, not {name1!r} twice; "
                            f"one sweep's best settings: nalu-sweep best {name1}")
        uri = tracking_uri_of(tracking_uri, must_exist=True)
        require_sweeps(uri, name1, name2)
        from service.tracking.queries import load_sweep, validated_metrics

        client = open_client(uri)
        views = [load_sweep(client, n) for n in (name1, name2)]
        validated = [validated_metrics(client, v) for v in views]
    except UserError as e:
        fail(str(e))
    rows = []
    for v, vals in zip(views, validated):
        ranked = v.ranked() or v.ranked(include_pruned=True)
        for i, t in enumerate(ranked[:top]):
            settings = [f"{p}={fmt_param(t.params[p])}" for p in v.searched if t.params.get(p) is not None]
            rows.append([v.name, str(i + 1), t.name, fmt_number(t.objective, ".4f"), success_cell(t.metrics),
                         success_cell(vals[t.run_id]) if t.run_id in vals else MISSING, ", ".join(settings)])
    cols = ["sweep", "rank", "trial", "objective", "search success [95% CI]", "validation [95% CI]", "settings"]
    keep = [j for j, c in enumerate(cols) if c != "validation [95% CI]" or any(r[j] != MISSING for r in rows)]
    table = Table(title=f"{name1} vs {name2}")
    for j in keep:
        table.add_column(cols[j], overflow="fold", no_wrap=cols[j] != "settings",
                         justify="right" if cols[j] in ("rank", "objective") else "left")
    for r in rows:
        table.add_row(*(r[j] for j in keep))
    print_wide(table)
