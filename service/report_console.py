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


def _ci(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f"[{_fmt(low)}, {_fmt(high)}]"


def print_run_result(result: RunResult, console: Console) -> None:
    """One configuration's outcome as a two-column table (readable in any terminal width)."""
    a = result.aggregate
    cfg = result.config
    units = " → ".join(layer.unit for layer in cfg.layers())
    op = getattr(cfg.task, "operation", None)
    table = Table(title=f"{cfg.task.kind}{f' · {op}' if op else ''} · {units} · {a.n_seeds} seeds")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("success rate [95% CI]", f"{a.successes}/{a.n_seeds} = {a.success_rate:.0%} "
                  f"[{a.success_ci_low:.0%}, {a.success_ci_high:.0%}]")
    table.add_row("solved_at median", _fmt(a.solved_at_median, ".0f"))
    table.add_row("sparsity error (solved seeds, best step) [95% CI]",
                  f"{_fmt(a.sparsity_error_mean)} {_ci(a.sparsity_error_ci_low, a.sparsity_error_ci_high)}")
    table.add_row("final sparsity error (non-diverged) [95% CI]",
                  f"{_fmt(a.final_sparsity_error_mean)} "
                  f"{_ci(a.final_sparsity_error_ci_low, a.final_sparsity_error_ci_high)}")
    table.add_row("diverged", str(a.diverged))
    table.add_row("interpolation MSE (median)", _fmt(a.interpolation_mse_median))
    for name, thr in result.thresholds.items():
        table.add_row(f"{name} MSE (median) / threshold",
                      f"{_fmt(a.extrapolation_mse_median.get(name))} / {thr:.3g}")
    console.print(table)
    rate = cfg.train.steps * a.n_seeds / max(result.elapsed_s, 1e-9)
    console.print(f"{result.elapsed_s:.1f} s on {result.device}"
                  f"{' (compiled)' if result.compiled else ''}: {rate:,.0f} seed·steps/s")
