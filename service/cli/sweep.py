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
    ADDRESS_HELP,
    TRACKING_HELP,
    no_such_sweep,
    open_client,
    print_wide,
    success_cell,
    tracking_uri_of,
)
from service.errors import UserError
from service.formatting import fmt_number, redact
from service.names import require_sweep_name
from service.tracking.store import Outcome
from service.cli.tables import best_table, winner_table


@app.command()
def sweep(
    space_file: Path = typer.Argument(..., help="Search space YAML (see search_spaces/)."),
    trials: Optional[int] = typer.Option(None, help="Number of trials (default: the file's)."),
    seeds: Optional[int] = typer.Option(None, help="Training seeds per trial (default: the file's)."),
    steps: Optional[int] = typer.Option(None, help="Training steps per seed (default: the file's)."),
    eval_every: Optional[int] = typer.Option(None, help="Evaluate and report every k steps (default: the file's)."),
    concurrency: Optional[int] = typer.Option(None, help="Trials running at once (default: the file's)."),
    pack: Optional[int] = typer.Option(None, help="Train up to K trials as one computation (default: the file's, 1)."),
    scheduler: Optional[str] = typer.Option(
        None, metavar="asha|race|none",
        help="How trials are stopped (default: the file's). asha: by steps, at rungs of the intermediate "
             "objective. race: by seeds — each setting trains a first block of seeds and gets more (×2 up "
             "to a maximum) only while a paired test on the seeds it shares with the best setting so far "
             "cannot show it worse (docs/racing.md; the file's scheduler keys first_block, growth, "
             "max_seeds, alpha, test set it). none: every trial trains all its seeds and steps."),
    cpus_per_trial: Optional[float] = typer.Option(None, help="CPUs reserved per trial (torch uses as many threads)."),
    gpus_per_trial: Optional[float] = typer.Option(None, help="GPUs per trial; fractions share a GPU, e.g. 0.25."),
    name: Optional[str] = typer.Option(None, help="Sweep name: MLflow experiment and Ray experiment directory (default: the file's 'name')."),
    address: Optional[str] = typer.Option(None, help=ADDRESS_HELP),
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
        from service.search.loading import load_space, with_overrides

        space = with_overrides(
            load_space(space_file), f"{space_file} with the command-line options",
            trials=trials, seeds=seeds, steps=steps, eval_every=eval_every, concurrency=concurrency,
            cpus=cpus_per_trial, gpus=gpus_per_trial, pack=pack, scheduler=scheduler,
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
        packs = f" (in packs of {space.pack})" if space.pack > 1 else ""
        race = space.scheduler.race() if space.scheduler.type == "race" else None
        seeds_text = f"{race.first_block}–{race.max_seeds} seeds (raced)" if race else f"{space.seeds} seeds"
        console.print(f"sweep [bold]{sweep_name}[/]: {space.trials} trials × {seeds_text} × {space.steps} "
                      f"steps, {space.concurrency} at a time{packs}; tracking {redact(options.tracking_uri)}",
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
    deciding = view is not None and validate is not None and summary.outcome == Outcome.COMPLETED
    ranking = None
    if view is not None and view.ranked():
        ranking = best_table(view, top=5, width=console.width if console.is_terminal else None)
        if not deciding:  # else after the verdict: the answer first, the long table under it
            print_wide(ranking)
    if summary.outcome != Outcome.COMPLETED:
        console.print(f"details: [bold]nalu-sweep best {summary.name}[/], or browse with [bold]nalu-sweep ui[/]",
                      highlight=False)
        console.print(f"continue with: nalu-sweep sweep {space_file} --resume --name {summary.name}",
                      highlight=False)
        raise typer.Exit(1)
    if view is not None and validate is not None and view.ranked():
        try:
            decision.validate_and_report(summary.tracking_uri, summary.name, validate, validate_seeds, address,
                                         stop_ray=summary.ray_left_running or summary.ray_connected)
        except UserError as e:
            fail(str(e))
        if ranking is not None:
            print_wide(ranking)
        return
    if view is not None:
        decision.best_line(view)
    decision.next_steps(summary.name)
    decision.print_links(summary.tracking_uri, summary.experiment_id, compare=decision.compare_ids(view, {})
                         if view is not None else [])


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
        from service.tracking.queries import list_sweeps, load_sweep, sweep_names, validated_metrics

        client = open_client(uri)
        try:
            views = [load_sweep(client, name)] if name else list_sweeps(client)
            validated = {v.run_id: validated_metrics(client, v) for v in views if v is not None}
        except Exception as e:  # noqa: BLE001 - an unreachable or refusing tracking store
            raise UserError(f"cannot read the MLflow tracking store {uri}: {e}") from None
        if name and views[0] is None:
            raise no_such_sweep(name, uri, sweep_names(client))
    except UserError as e:
        fail(str(e))
    if not views:
        console.print(f"no sweeps in {redact(uri)}")
        return
    table = Table(title=f"sweeps in {redact(uri)}")
    rows = []
    for v in views:
        c = v.counts()
        ranked = v.ranked()
        top = ranked[0] if ranked else None
        started = datetime.fromtimestamp(v.start_time / 1000).strftime("%Y-%m-%d %H:%M") if v.start_time else "—"
        finished = c["completed"] + c["pruned"] + c["failed"]
        rows.append({"sweep": v.name, "state": str(v.outcome or v.status.lower()), "started": started,
                     "finished/planned": f"{finished}/{v.planned_trials or '?'}", "running": str(c["running"]),
                     "completed": str(c["completed"]), "pruned": str(c["pruned"]), "failed": str(c["failed"]),
                     "interrupted": str(c["interrupted"]), "best objective": fmt_number(top.objective if top else None, ".4f"),
                     "best success [95% CI]": success_cell(top.metrics) if top else "—",
                     "its validation [95% CI]": (success_cell(validated[v.run_id][top.run_id])
                                                 if top and top.run_id in validated[v.run_id] else "—")})
    # a count that is 0 for every sweep is left out (it would only take room), and so is a
    # validation no sweep has
    cols = [k for k in rows[0] if k not in ("running", "interrupted", "failed", "its validation [95% CI]")
            or any(r[k] not in ("0", "—") for r in rows)]
    natural = sum(max(len(col), *(len(r[col]) for r in rows)) + 3 for col in cols) + 1
    if console.is_terminal and natural > console.width:  # one short table per sweep, nothing cut
        for r in rows:
            one = Table(title=f"sweep {r['sweep']}", show_header=False)
            one.add_column("what", style="bold")
            one.add_column("value", overflow="fold")
            for col in cols[1:]:
                one.add_row(col, r[col])
            console.print(one)
        table = None
    else:
        for col in cols:
            table.add_column(col, justify="left" if col in ("sweep", "state") else "right")
        for r in rows:
            table.add_row(*(r[col] for col in cols))
    if table is not None:
        print_wide(table)
    if name:
        v = views[0]
        fresh = validated[v.run_id]
        trials = Table(title=f"trials of {v.name}")
        raced = any(t.race for t in v.trials)  # a race: the seeds each setting got, where it left
        for col in ("trial", "outcome", "status", "objective", "success [95% CI]",
                    *(["validation [95% CI]"] if fresh else []), *(["seeds", "race"] if raced else [])):
            trials.add_column(col)
        for t in v.trials:
            trials.add_row(t.name, t.outcome, t.status, fmt_number(t.objective, ".4f"), success_cell(t.metrics),
                           *([success_cell(fresh[t.run_id]) if t.run_id in fresh else "—"] if fresh else []),
                           *([fmt_number(t.metrics.get("n_seeds"), ".0f"), t.race or "—"] if raced else []))
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
    median solved_at, mean sparsity error over solved seeds at their best-validation step
    (the NAU paper's figure) and the final model's, best first; with --format yaml|json, the
    best trial's (or --trial's) complete run config."""
    from service.cli import decision

    try:
        require_sweep_name(name, "NAME")
        if format_ not in decision.FORMATS:
            raise UserError(f"--format {format_!r}: one of {', '.join(decision.FORMATS)}")
        uri = tracking_uri_of(tracking_uri, must_exist=True)
        from service.tracking.pooled import pooled_validations
        from service.tracking.queries import load_sweep, sweep_names

        client = open_client(uri)
        try:
            view = load_sweep(client, name)
        except Exception as e:  # noqa: BLE001 - an unreachable or refusing tracking store
            raise UserError(f"cannot read the MLflow tracking store {uri}: {e}") from None
        if view is None:
            raise no_such_sweep(name, uri, sweep_names(client))
        if format_ != "table":  # only the config on stdout: it is meant for a file
            row = decision.pick_trial(view, trial, include_pruned)
            print(decision.export_config(uri, view, row, task, format_))
            return
        if trial is not None:
            view.trials = [decision.pick_trial(view, trial, include_pruned=True)]
            include_pruned = True
        validations = pooled_validations(client, view)  # every validation of a setting, pooled
        validated = {trial: pooled.metrics for trial, pooled in validations.items()}
    except UserError as e:
        fail(str(e))
    if not view.ranked(include_pruned):
        c = view.counts()
        console.print(f"sweep {name}: no finished trial yet ({c['running']} running, {c['pruned']} pruned, "
                      f"{c['failed']} failed)")
        return
    print_wide(winner_table(view, include_pruned, validated))
    print_wide(best_table(view, top, include_pruned, width=console.width if console.is_terminal else None,
                          validated=validated))
    decision.print_sweep_links(uri, view, report=decision.has_report(view), validations=validations)


@app.command()
def ui(
    tracking_uri: Optional[str] = typer.Option(None, help=TRACKING_HELP),
    host: str = typer.Option("127.0.0.1", help="Address to bind (local only by default)."),
    port: int = typer.Option(5000, min=1, max=65535, help="Port to serve on."),
    workers: int = typer.Option(1, min=1, max=64, help="MLflow server worker processes (one is plenty for one user)."),
) -> None:
    """Start `mlflow ui` on the configured tracking store and print its URL (Ctrl-C or
    SIGTERM stops it, with every process it started)."""
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
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port),
           "--workers", str(workers)]
    root = artifact_root(uri)
    if root:
        cmd += ["--default-artifact-root", root]
    from service.cli.decision import ui_links

    base = f"http://{host}:{port}"
    console.print(f"MLflow UI for {uri}: [bold]{base}[/] (Ctrl-C to stop); each sweep's runs table:",
                  highlight=False)
    for line in ui_links(uri, base):
        console.print(line, highlight=False, soft_wrap=True)
    code = serve(cmd)
    if code not in (0, -2, -15, 130, 143):
        fail(f"mlflow ui exited with code {code} (is port {port} in use? try --port)", code=1)


def serve(cmd: list[str], grace_s: float = 10.0) -> int:
    """Run ``cmd`` in a process group of its own until it exits, or until this process gets
    SIGTERM/SIGINT: then the whole group (the server and its workers) is stopped — SIGTERM,
    SIGKILL after ``grace_s`` — so nothing is left serving. Returns its exit code."""
    import os
    import signal

    proc = subprocess.Popen(cmd, start_new_session=True)

    def stop_group(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop_group)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # workers that outlived their server
        except (ProcessLookupError, PermissionError):
            pass
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
