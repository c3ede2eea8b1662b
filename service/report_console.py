"""Terminal output of a run: a live progress bar and the result table."""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from service.config import RunConfig
from service.errors import UserError
from service.training import EvalReport, Trainer
from service.training.result import RunResult


def solved_now(report: EvalReport, thresholds: dict[str, float]) -> int:
    """Seeds below every extrapolation threshold at this evaluation (a live hint only)."""
    ok = ~report.diverged
    for name, mse in report.extrapolation_mse.items():
        ok &= np.nan_to_num(mse, nan=np.inf) < thresholds[name]
    return int(ok.sum())


def run_with_progress(config: RunConfig, console: Console, quiet: bool = False) -> RunResult:
    try:
        trainer = Trainer(config)
    except ValueError as e:  # e.g. --device cuda without CUDA
        raise UserError(str(e)) from None
    if quiet:
        return trainer.run()
    columns = [
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(
            f"{config.seeds} seeds", total=config.train.steps,
            status="compiling…" if trainer.compiled else "",
        )

        def on_eval(report: EvalReport) -> None:
            solved = solved_now(report, trainer.thresholds)
            status = f"solved {solved}/{config.seeds}, diverged {int(report.diverged.sum())}"
            progress.update(bar, completed=report.step, status=status)

        return trainer.run(on_eval)


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "—" if value is None or not np.isfinite(value) else format(value, spec)


def print_run_result(result: RunResult, console: Console) -> None:
    a = result.aggregate
    cfg = result.config
    units = " → ".join(layer.unit for layer in cfg.layers())
    table = Table(title=f"{cfg.task.kind} · {getattr(cfg.task, 'operation', '')} · {units} · {a.n_seeds} seeds")
    for col in ("success rate [95% CI]", "solved_at median", "sparsity error", "diverged",
                "interpolation MSE (median)"):
        table.add_column(col, justify="right")
    for name in result.thresholds:
        table.add_column(f"{name} MSE (median) / threshold", justify="right")
    row = [
        f"{a.successes}/{a.n_seeds} = {a.success_rate:.0%} [{a.success_ci_low:.0%}, {a.success_ci_high:.0%}]",
        _fmt(a.solved_at_median, ".0f"),
        _fmt(a.sparsity_error_mean),
        str(a.diverged),
        _fmt(a.interpolation_mse_median),
    ]
    for name, thr in result.thresholds.items():
        row.append(f"{_fmt(a.extrapolation_mse_median.get(name))} / {thr:.3g}")
    table.add_row(*row)
    console.print(table)
    rate = cfg.train.steps * a.n_seeds / max(result.elapsed_s, 1e-9)
    console.print(f"{result.elapsed_s:.1f} s on {result.device}"
                  f"{' (compiled)' if result.compiled else ''}: {rate:,.0f} seed·steps/s")
