"""The sweep verbs of `nalu-sweep`: ``sweep``, ``status``, ``best`` and ``ui``.

Registered on the `service.cli` app; heavy imports (Ray, MLflow) happen inside the verbs.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from service.cli.app import app, console, fail
from service.cli.common import (
    TRACKING_HELP,
    open_client,
    print_wide,
    success_cell,
    tracking_uri_of,
)
from service.errors import UserError
from service.formatting import fmt_number, fmt_param, redact
from service.names import require_sweep_name
from service.tracking.store import Outcome


def best_table(view, top: int, include_pruned: bool = False) -> Table:
    """The robust settings of a sweep: parameters, success rate [95% CI], solved_at,
    sparsity error, ranked by the objective (the CI's lower end, then tie-breakers)."""
    rows = view.ranked(include_pruned)[:top]
    table = Table(title=f"sweep {view.name}: top {len(rows)} by success_ci_low "
                        f"(lower end of the 95% Wilson interval)")
    table.add_column("#", justify="right")
    table.add_column("trial")
    names = view.searched or sorted({k for r in rows for k in r.params if not k.startswith("task.")
                                     and k not in ("seeds", "steps", "eval_every")})
    for name in names:
        table.add_column(name)
    for col in ("success [95% CI]", "solved_at median", "sparsity error mean", "diverged", "objective"):
        table.add_column(col, justify="right")
    if include_pruned:
        table.add_column("outcome")
    for i, r in enumerate(rows, 1):
        m = r.metrics
        params = [fmt_param(r.params.get(n)) for n in names]
        cells = [str(i), r.name, *params, success_cell(m), fmt_number(m.get("solved_at_median"), ".0f"),
                 fmt_number(m.get("sparsity_error_mean")), fmt_number(m.get("diverged"), ".0f"),
                 fmt_number(r.objective, ".4f")]
        if include_pruned:
            cells.append(r.outcome)
        table.add_row(*cells)
    return table


@app.command()
def sweep(
    space_file: Path = typer.Argument(..., help="Search space YAML (see search_spaces/)."),
    trials: Optional[int] = typer.Option(None, help="Number of trials (default: the file's)."),
    seeds: Optional[int] = typer.Option(None, help="Training seeds per trial (default: the file's)."),
    steps: Optional[int] = typer.Option(None, help="Training steps per seed (default: the file's)."),
    eval_every: Optional[int] = typer.Option(None, help="Evaluate and report every k steps (default: the file's)."),
    concurrency: Optional[int] = typer.Option(None, help="Trials running at once (default: the file's)."),
    cpus_per_trial: Optional[float] = typer.Option(None, help="CPUs reserved per trial (torch uses as many threads)."),
    gpus_per_trial: Optional[float] = typer.Option(None, help="GPUs per trial; fractions share a GPU, e.g. 0.25."),
    name: Optional[str] = typer.Option(None, help="Sweep name: MLflow experiment and Ray experiment directory (default: the file's 'name')."),
    address: Optional[str] = typer.Option(None, help="Ray cluster to connect to (default: start a local Ray)."),
    tracking_uri: Optional[str] = typer.Option(None, help=TRACKING_HELP),
    storage_path: Optional[str] = typer.Option(None, help="Ray Tune storage: a shared directory or s3:// URI (default: ./runs)."),
    optuna_storage: Optional[str] = typer.Option(
        None, envvar="NALU_SWEEP_OPTUNA_STORAGE",
        help="Keep the Optuna study (named like the sweep) in this database, e.g. "
             "postgresql+psycopg://user:pass@host/optuna (default: in memory, saved with Tune's state)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep of the same name."),
    verbose: bool = typer.Option(False, "--verbose", help="Show Ray's worker logs."),
    validate: Optional[int] = typer.Option(
        None, "--validate", min=1, metavar="K",
        help="Then re-train the top K settings on fresh seeds, build the report and end with the verdict."),
    validate_seeds: int = typer.Option(32, min=1, help="Fresh seeds per setting for --validate."),
) -> None:
    """Search a space: Ray Tune runs the trials, Optuna (TPE) picks them, ASHA stops hopeless
    ones early, and MLflow records one parent run with one child run per trial.

    Each trial trains S seeds of one setting; the objective is the lower end of the 95%
    Wilson interval of its success rate.
    """
    try:
        if name is not None:
            require_sweep_name(name, "--name")
        from service.endpoints import check_database_url, check_ray_address

        # servers first, before the heavy imports: Ray and MLflow would retry them for minutes
        uri = tracking_uri_of(tracking_uri, must_exist=False)
        check_ray_address(address)
        if optuna_storage:
            check_database_url(optuna_storage)
        from service.search.loading import load_space

        space = load_space(space_file).with_overrides(
            f"{space_file} with the command-line options",
            trials=trials, seeds=seeds, steps=steps, eval_every=eval_every, concurrency=concurrency,
            cpus=cpus_per_trial, gpus=gpus_per_trial,
        )
        sweep_name = space.name if name is None else name
        require_sweep_name(sweep_name, f"{space_file}: name")
        if resume and uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            raise UserError(f"nothing to resume: no tracking store at {uri.removeprefix('sqlite:///')} "
                            "(use the same --tracking-uri as the original sweep)")
        from service.sweep.driver import SweepOptions, resolve_storage_path, run_sweep

        options = SweepOptions(
            name=sweep_name, tracking_uri=uri,
            storage_path=resolve_storage_path(storage_path), space_file=space_file.resolve(),
            address=address, resume=resume, verbose=verbose, optuna_storage=optuna_storage,
            keep_ray=validate is not None,
        )
        console.print(f"sweep [bold]{sweep_name}[/]: {space.trials} trials × {space.seeds} seeds × "
                      f"{space.steps} steps, {space.concurrency} at a time; tracking {redact(options.tracking_uri)}",
                      highlight=False)
        summary = run_sweep(space, options, console)
    except UserError as e:
        fail(str(e))
    from service.cli import decision

    c = summary.trials
    console.print(f"sweep [bold]{summary.name}[/] {summary.outcome}: {c.get('completed', 0)} completed, "
                  f"{c.get('pruned', 0)} pruned, {c.get('failed', 0)} failed, "
                  f"{c.get('interrupted', 0)} interrupted", highlight=False)
    from service.tracking.queries import load_sweep

    try:
        view = load_sweep(open_client(summary.tracking_uri), summary.name)
    except Exception as e:  # noqa: BLE001 - the store went away after the sweep was recorded
        console.print(f"[yellow]cannot show the best settings now ({type(e).__name__}); "
                      f"try `nalu-sweep best {summary.name}` later[/]", highlight=False)
        view = None
    if view is not None and view.ranked():
        print_wide(best_table(view, top=5))
    if summary.outcome != Outcome.COMPLETED:
        console.print(f"details: [bold]nalu-sweep best {summary.name}[/], or browse with [bold]nalu-sweep ui[/]",
                      highlight=False)
        console.print(f"continue with: nalu-sweep sweep {space_file} --resume --name {summary.name}",
                      highlight=False)
        raise typer.Exit(1)
    if view is not None and validate is not None and view.ranked():
        try:
            decision.validate_and_report(summary.tracking_uri, summary.name, validate, validate_seeds, address,
                                         stop_ray=summary.ray_left_running)
        except UserError as e:
            fail(str(e))
        return
    if view is not None:
        decision.best_line(view)
    decision.next_steps(summary.name)
    decision.print_links(summary.tracking_uri, summary.experiment_id)


@app.command()
def status(
    name: Optional[str] = typer.Argument(None, help="A sweep name (default: list every sweep)."),
    tracking_uri: Optional[str] = typer.Option(None, help=TRACKING_HELP),
) -> None:
    """Trials done / running / pruned / failed and the best objective so far."""
    try:
        if name is not None:
            require_sweep_name(name, "NAME")
        uri = tracking_uri_of(tracking_uri, must_exist=True)
        from service.tracking.queries import list_sweeps, load_sweep

        client = open_client(uri)
        try:
            views = [load_sweep(client, name)] if name else list_sweeps(client)
        except Exception as e:  # noqa: BLE001 - an unreachable or refusing tracking store
            raise UserError(f"cannot read the MLflow tracking store {uri}: {e}") from None
        if name and views[0] is None:
            known = ", ".join(v.name for v in list_sweeps(client)) or "(none)"
            raise UserError(f"no sweep named {name!r} in {uri}; sweeps: {known}")
    except UserError as e:
        fail(str(e))
    if not views:
        console.print(f"no sweeps in {redact(uri)}")
        return
    table = Table(title=f"sweeps in {redact(uri)}")
    for col in ("sweep", "state", "started", "finished/planned", "running", "completed", "pruned", "failed",
                "interrupted", "best objective", "best success [95% CI]"):
        table.add_column(col, justify="left" if col in ("sweep", "state") else "right")
    for v in views:
        c = v.counts()
        ranked = v.ranked()
        top = ranked[0] if ranked else None
        started = datetime.fromtimestamp(v.start_time / 1000).strftime("%Y-%m-%d %H:%M") if v.start_time else "—"
        finished = c["completed"] + c["pruned"] + c["failed"]
        table.add_row(v.name, v.outcome or v.status.lower(), started, f"{finished}/{v.planned_trials or '?'}",
                      str(c["running"]), str(c["completed"]), str(c["pruned"]), str(c["failed"]),
                      str(c["interrupted"]), fmt_number(top.objective if top else None, ".4f"),
                      success_cell(top.metrics) if top else "—")
    print_wide(table)
    if name:
        v = views[0]
        trials = Table(title=f"trials of {v.name}")
        for col in ("trial", "outcome", "status", "objective", "success [95% CI]"):
            trials.add_column(col)
        for t in v.trials:
            trials.add_row(t.name, t.outcome, t.status, fmt_number(t.objective, ".4f"), success_cell(t.metrics))
        print_wide(trials)


@app.command()
def best(
    name: str = typer.Argument(..., help="The sweep name."),
    top: int = typer.Option(10, min=1, help="How many settings to show."),
    include_pruned: bool = typer.Option(False, "--include-pruned", help="Also rank trials ASHA stopped early."),
    tracking_uri: Optional[str] = typer.Option(None, help=TRACKING_HELP),
    trial: Optional[str] = typer.Option(None, "--trial", help="A trial (trial-ID, its run id or run name) instead of the best."),
    format_: str = typer.Option("table", "--format", help="table: the ranking; yaml or json: the trial's complete "
                                "run config, which `nalu-sweep run FILE` trains as is."),
    task: Optional[str] = typer.Option(None, "--task", help="The task whose run config to print (a sweep of several tasks)."),
) -> None:
    """The most robust settings of a sweep: parameters, success rate with its 95% CI,
    median solved_at and mean sparsity error, best first; with --format yaml|json, the best
    trial's (or --trial's) complete run config."""
    from service.cli import decision

    try:
        require_sweep_name(name, "NAME")
        if format_ not in decision.FORMATS:
            raise UserError(f"--format {format_!r}: one of {', '.join(decision.FORMATS)}")
        uri = tracking_uri_of(tracking_uri, must_exist=True)
        from service.tracking.queries import list_sweeps, load_sweep

        client = open_client(uri)
        try:
            view = load_sweep(client, name)
        except Exception as e:  # noqa: BLE001 - an unreachable or refusing tracking store
            raise UserError(f"cannot read the MLflow tracking store {uri}: {e}") from None
        if view is None:
            known = ", ".join(v.name for v in list_sweeps(client)) or "(none)"
            raise UserError(f"no sweep named {name!r} in {uri}; sweeps: {known}")
        if format_ != "table":  # only the config on stdout: it is meant for a file
            row = decision.pick_trial(view, trial, include_pruned)
            print(decision.export_config(uri, view, row, task, format_))
            return
        if trial is not None:
            view.trials = [decision.pick_trial(view, trial, include_pruned=True)]
            include_pruned = True
    except UserError as e:
        fail(str(e))
    if not view.ranked(include_pruned):
        c = view.counts()
        console.print(f"sweep {name}: no finished trial yet ({c['running']} running, {c['pruned']} pruned, "
                      f"{c['failed']} failed)")
        return
    print_wide(best_table(view, top, include_pruned))
    decision.print_links(uri, view.experiment_id, view.run_id, report=decision.has_report(view))


@app.command()
def ui(
    tracking_uri: Optional[str] = typer.Option(None, help=TRACKING_HELP),
    host: str = typer.Option("127.0.0.1", help="Address to bind (local only by default)."),
    port: int = typer.Option(5000, min=1, max=65535, help="Port to serve on."),
) -> None:
    """Start `mlflow ui` on the configured tracking store and print its URL (Ctrl-C stops it)."""
    from service.tracking.store import artifact_root

    try:
        uri = tracking_uri_of(tracking_uri, must_exist=True, probe=False)  # a server is only named
    except UserError as e:
        fail(str(e))
    if uri.startswith(("http://", "https://")):
        from service.cli.decision import ui_links
        from service.tracking.links import ui_base

        console.print(f"the tracking store is an MLflow server: open {redact(uri)}; each sweep's runs table:")
        for line in ui_links(uri, ui_base(uri)[0]):
            console.print(line, highlight=False, soft_wrap=True)
        return
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    root = artifact_root(uri)
    if root:
        cmd += ["--default-artifact-root", root]
    from service.cli.decision import ui_links

    base = f"http://{host}:{port}"
    console.print(f"MLflow UI for {uri}: [bold]{base}[/] (Ctrl-C to stop); each sweep's runs table:",
                  highlight=False)
    for line in ui_links(uri, base):
        console.print(line, highlight=False, soft_wrap=True)
    try:
        proc = subprocess.run(cmd, check=False)
    except KeyboardInterrupt:
        return
    if proc.returncode not in (0, -2, 130):
        fail(f"mlflow ui exited with code {proc.returncode} (is port {port} in use? try --port)", code=1)
