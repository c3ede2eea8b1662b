"""``nalu-sweep run``: train one configuration over S seeds, with a live progress bar and a
result table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from service import startup
from service.cli.app import app, console, fail
from service.cli.common import print_wide
from service.errors import UserError
from service.formatting import fmt_interval, fmt_number

if TYPE_CHECKING:  # torch comes in with these: only the verb that trains imports them
    from service.config import RunConfig
    from service.training import EvalReport
    from service.training.result import RunResult
    from service.units.schedule import RegularizerSchedule


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_yaml(path: Path) -> dict[str, Any]:
    from service.yamlio import load_mapping

    return load_mapping(path)


@app.command()
def run(
    config_file: Optional[Path] = typer.Argument(None, help="YAML run config (task, model, train, seeds); flags override it."),
    task: Optional[str] = typer.Option(None, help="Task kind: arithmetic, small_mul, single_unit, subset_only, operation_only, identity, many_operands, sequence_arithmetic, sequential_digits."),
    operation: Optional[str] = typer.Option(None, help="Operation: add, sub, mul, div, squared, root (static tasks that have one); sum or prod (recurrent tasks)."),
    units: Optional[str] = typer.Option(None, help="Comma-separated unit per layer, e.g. 'nau,nmu' (default: the task's reference model)."),
    init: Optional[str] = typer.Option(None, help="Initialisation for every layer: default, kaiming_uniform, xavier_uniform, ..., uniform(a,b)."),
    interpolation: Optional[str] = typer.Option(None, help="Training range, e.g. 'U[1,2]'."),
    extrapolation: Optional[list[str]] = typer.Option(None, help="Extrapolation range, 'U[2,6]' or 'name=U[-6,-2] ∪ U[2,6]'; repeat for several."),
    seeds: Optional[int] = typer.Option(None, help="Number of seeds trained together (default 16)."),
    seed_offset: Optional[int] = typer.Option(None, help="First seed id (seeds are offset .. offset+S-1)."),
    master_seed: Optional[int] = typer.Option(None, help="Master seed every per-seed stream is derived from."),
    steps: Optional[int] = typer.Option(None, help="Training steps."),
    lr: Optional[float] = typer.Option(None, help="Learning rate."),
    optimizer: Optional[str] = typer.Option(None, help="adam, rmsprop or sgd."),
    batch_size: Optional[int] = typer.Option(None, help="Batch size per seed."),
    eval_every: Optional[int] = typer.Option(None, help="Evaluate every k steps."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or auto."),
    compile: Optional[str] = typer.Option(None, "--compile", help="torch.compile the step: auto, on or off."),
    threads: int = typer.Option(1, help="CPU threads for torch (these models are tiny: 1 is usually fastest)."),
    output: Path = typer.Option(Path("result.json"), help="Where to write the JSON result with every per-seed metric."),
    quiet: bool = typer.Option(False, help="No progress bar."),
) -> None:
    """Train ONE configuration over S seeds and report how robustly it learns.

    Prints success rate with its 95% Wilson interval, solved_at, sparsity error and
    diverged seeds, and writes every per-seed metric to a JSON file.
    """
    from service.config import RunConfig
    from service.units.registry import UnknownUnitError

    merged: dict[str, Any] = {}
    try:
        data = _load_yaml(config_file) if config_file else {}
        flags: dict[str, Any] = {}
        task_flags = {k: v for k, v in {"kind": task, "operation": operation, "interpolation": interpolation}.items() if v is not None}
        if extrapolation:
            ranges = {}
            for i, item in enumerate(extrapolation):
                name, _, rng = item.partition("=") if "=" in item else ("extrapolation" if i == 0 else f"extrapolation{i + 1}", "", item)
                ranges[name.strip()] = rng.strip()
            task_flags["extrapolation"] = ranges
        if task_flags:
            flags["task"] = task_flags
        if "task" not in data and "task" not in flags:
            flags["task"] = {"kind": "arithmetic"}
        if units:
            flags["model"] = {"layers": [{"unit": u.strip(), **({"init": init} if init else {})} for u in units.split(",")]}
        elif init:
            raise UserError("--init needs --units (it applies to the layers you name)")
        train_flags = {k: v for k, v in {"steps": steps, "batch_size": batch_size, "eval_every": eval_every}.items() if v is not None}
        opt = {k: v for k, v in {"name": optimizer, "lr": lr}.items() if v is not None}
        if opt:
            train_flags["optimizer"] = opt
        if train_flags:
            flags["train"] = train_flags
        for key, value in {"seeds": seeds, "seed_offset": seed_offset, "master_seed": master_seed,
                           "device": device, "compile": compile}.items():
            if value is not None:
                flags[key] = value
        merged = _deep_merge(data, flags)
        if isinstance(merged.get("task"), dict) and "kind" not in merged["task"]:
            merged["task"] = {"kind": "arithmetic", **merged["task"]}
        config = RunConfig.model_validate(merged)
    except ValidationError as e:
        from service.search.loading import describe_run_config_error

        fail("invalid run configuration:\n" + describe_run_config_error(e, merged, str(config_file) if config_file else None))
    except (UserError, UnknownUnitError) as e:
        fail(str(e))

    import torch

    torch.set_num_threads(max(1, threads))

    try:
        result = run_with_progress(config, console, quiet=quiet)
    except UserError as e:
        fail(str(e))
    path = result.save_json(output)
    print_run_result(result, console)
    console.print(f"per-seed results: [bold]{path}[/]")


def solved_now(report: EvalReport, thresholds: dict[str, float]) -> int:
    """Seeds below every extrapolation threshold at this evaluation (a live hint only)."""
    import numpy as np

    ok = ~report.diverged
    for name, mse in report.extrapolation_mse.items():
        ok &= np.nan_to_num(mse, nan=np.inf) < thresholds[name]
    return int(ok.sum())


def run_with_progress(config: RunConfig, console: Console, quiet: bool = False) -> RunResult:
    from service.training import Trainer

    try:
        trainer = Trainer(config)
    except ValueError as e:  # e.g. --device cuda without CUDA
        raise UserError(str(e)) from None
    startup.loaded()  # torch and the trainer: the collector back to its pace for the training
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

        result = trainer.run(on_eval)
        progress.update(bar, completed=config.train.steps, status=final_status(result))
        return result


def final_status(result: RunResult) -> str:
    """The progress line's last words: the result's own counts, so they agree with the table
    under it (the live hint counts seeds under the thresholds at one evaluation; the result
    judges each seed at its best step)."""
    a = result.aggregate
    return f"solved {a.successes}/{a.n_seeds}, diverged {a.diverged}"


def _ci(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f"[{fmt_number(low)}, {fmt_number(high)}]"


def describe_schedule(s: RegularizerSchedule) -> str:
    """E.g. ``linear 0 → 10 over steps 10,000–20,000``."""
    text = (f"constant {s.lambda_max:g} from step {s.t_start:,}" if s.shape == "constant"
            else f"{s.shape} 0 → {s.lambda_max:g} over steps {s.t_start:,}–{s.t_end:,}")
    return text + (f", oob {s.oob:g}" if s.oob else "")


def print_run_result(result: RunResult, console: Console) -> None:
    """One configuration's outcome as a two-column table (readable in any terminal width;
    never wrapped into a file or pipe: `service.cli.common.print_wide`)."""
    a = result.aggregate
    cfg = result.config
    units = " → ".join(layer.unit for layer in cfg.layers())
    op = getattr(cfg.task, "operation", None)
    table = Table(title=f"{cfg.task.kind}{f' · {op}' if op else ''} · {units} · {a.n_seeds} seeds")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("success rate [95% CI]", f"{a.successes}/{a.n_seeds} = {a.success_rate:.0%} "
                  f"[{fmt_interval(a.success_ci_low, a.success_ci_high)}]")
    table.add_row("solved_at median", fmt_number(a.solved_at_median, ".0f"))
    table.add_row("sparsity error (solved seeds, best step) [95% CI]",
                  f"{fmt_number(a.sparsity_error_mean)} {_ci(a.sparsity_error_ci_low, a.sparsity_error_ci_high)}")
    table.add_row("final sparsity error (non-diverged) [95% CI]",
                  f"{fmt_number(a.final_sparsity_error_mean)} "
                  f"{_ci(a.final_sparsity_error_ci_low, a.final_sparsity_error_ci_high)}")
    table.add_row("diverged", str(a.diverged))
    table.add_row("regulariser λ(t)" + (" (reference, scaled)" if cfg.train.regularizer is None else ""),
                  describe_schedule(cfg.regularizer()))
    table.add_row("interpolation MSE (median)", fmt_number(a.interpolation_mse_median))
    for name, thr in result.thresholds.items():
        table.add_row(f"{name} MSE (median) / threshold",
                      f"{fmt_number(a.extrapolation_mse_median.get(name))} / {thr:.3g}")
    print_wide(table, console)
    if getattr(cfg.task, "recurrent", False):
        print_length_table(result, console)
    rate = cfg.train.steps * a.n_seeds / max(result.elapsed_s, 1e-9)
    console.print(f"{result.elapsed_s:.1f} s on {result.device}"
                  f"{' (compiled)' if result.compiled else ''}: {rate:,.0f} seed·steps/s")


def print_length_table(result: RunResult, console: Console) -> None:
    """Recurrent tasks: success and the cell's median squared error (on the seed's own
    read-out) per test length, the read-out's, and the longest length solved."""
    from service.scoring.sequence import length_rows, longest_solved_summary

    task = result.config.task
    table = Table(title=f"per test length (trained on length {task.train_length})")
    for column in ("length", "success [95% CI]", "cell error (median)", "threshold"):
        table.add_column(column, justify="right")
    for row in length_rows(task, result.seeds, result.thresholds):
        label = "read-out (per-step MSE)" if row.length is None else str(row.length)
        table.add_row(label, f"{row.successes}/{row.n_seeds} [{row.ci_low:.0%}, {row.ci_high:.0%}]",
                      fmt_number(row.mse_median), f"{row.threshold:.3g}")
    print_wide(table, console)
    values, median = longest_solved_summary(task, result.seeds)
    console.print(f"longest length solved: median {fmt_number(median, '.0f')} (per seed: {values})")
