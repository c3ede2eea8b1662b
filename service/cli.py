"""The `nalu-sweep` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console

from service.errors import UserError, describe_validation_error

app = typer.Typer(
    help="Seed-robust hyperparameter search for neural arithmetic units "
    "(NAC, NALU, NAU, NMU, ...): train, sweep, and read off robust settings.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _main() -> None:
    """Seed-robust hyperparameter search for neural arithmetic units."""


def fail(message: str, code: int = 2) -> None:
    """Print a user-facing error (no traceback) and exit; a password inside a URI in the
    message (``scheme://user:pw@host``) is shown as ``***``."""
    from service.tracking.store import redact

    err_console.print(f"[bold red]error:[/] {redact(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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
    task: Optional[str] = typer.Option(None, help="Task kind: arithmetic, small_mul, single_unit, subset_only, operation_only, identity, many_operands."),
    operation: Optional[str] = typer.Option(None, help="Operation: add, sub, mul, div, squared, root (tasks that have one)."),
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
        fail("invalid run configuration:\n" + describe_validation_error(e, str(config_file) if config_file else None))
    except (UserError, UnknownUnitError) as e:
        fail(str(e))

    import torch

    from service.report_console import print_run_result, run_with_progress

    torch.set_num_threads(max(1, threads))

    try:
        result = run_with_progress(config, console, quiet=quiet)
    except UserError as e:
        fail(str(e))
    path = result.save_json(output)
    print_run_result(result, console)
    console.print(f"per-seed results: [bold]{path}[/]")


import service.cli_sweep  # noqa: E402,F401  (registers sweep, status, best, ui)
import service.cli_report  # noqa: E402,F401  (registers report, validate, compare)
