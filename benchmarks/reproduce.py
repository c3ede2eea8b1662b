"""Reproduce a table of the NAU paper (Madsen & Johansen, "Neural Arithmetic Units", ICLR 2020)
with this project's trainer and metrics, and print it beside the published one.

    python benchmarks/reproduce.py PROTOCOL [--seeds 100] [--device cpu|cuda|auto]
                                            [--steps N] [--out DIR] [--models A,B] [--engine]
                                            [--jobs N] [--cell-by-cell] [--resume]

PROTOCOL is one of:

* ``small_mul`` — the small multiplication problem ``t = (x1+x2+x3+x4)(x1+x2)`` (docs/domain/tasks.md),
  the paper's table "very-simple-function-results": Linear, NAC•, NALU and NMU, 2·10⁵ steps.
* ``arithmetic`` — the arithmetic datasets task (100 inputs, subsets of 25 overlapping by
  half) for + − × ÷, the paper's Table 1 and its appendix table: Linear, NAC+, NAC•, NALU,
  NAU, NMU and the gated NAU/NMU, 5·10⁶ steps.

Every setting of a protocol is written out in `PROTOCOLS` below (model, optimiser, batch,
evaluation, regulariser); nothing is taken from the project's defaults, so a change of a
default does not change a protocol. ``--steps`` shortens a run for a quick check: the
regulariser's warm-up then keeps the same fractions of the run. The published figures are
transcribed from the paper's tables (the reference repository's ``paper/results/*.tex``);
nothing here is tuned to match them.

Metrics (docs/domain/metrics.md, as in the paper): a seed succeeds when its extrapolation MSE at its
best-interpolation evaluation is below the ε = 1e-5 threshold; ``solved_at`` is the first
evaluation step below it (solved seeds); the sparsity error is taken at each solved seed's
best step and averaged over solved seeds. Intervals are 95% (Wilson for the success rate,
t for means, order statistics for the median).

Writes ``DIR/PROTOCOL.json`` (settings, aggregates, per-seed outcomes, published figures)
and ``DIR/PROTOCOL.md`` (the table).

A model's operations train as one seed batch (``service.training.packing``: the operation is
a per-seed setting of the arithmetic task, and each seed trains bit-identically to its cell
trained alone; ``--cell-by-cell`` trains each cell on its own instead). Each finished cell is
also written to ``DIR/cells/<op>-<model>/``, and a cell in training saves its trainer state
there every ``--checkpoint-every`` evaluations: ``--resume`` keeps the finished cells and
continues the others where they stopped (a lent GPU machine that goes away mid-protocol
loses minutes, not hours). ``--jobs N`` trains N models (or cells) at once, each in its own
process: the models side by side on one GPU. ``--merge FILE...`` writes the table from cells run earlier (other
machines or sessions): the same protocol, seeds and length; a cell none has is "not run".
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# run as a script from anywhere: the project root goes first on the path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.config import RunConfig  # noqa: E402
from service.engine import attach  # noqa: E402
from service.pack_structure import check_pack  # noqa: E402
from service.training import Trainer  # noqa: E402
from service.training.packing import PackedTrainer  # noqa: E402
from service.training.checkpoint import CheckpointError, TrainerCheckpoint  # noqa: E402

# -- the protocols ------------------------------------------------------------------------------
# Shared by both protocols (the reference code's defaults for these experiments): Adam,
# lr 1e-3, constant; batch 128; MSE loss; no gradient clipping, no re-initialisation; hidden
# size 2; evaluation every 1000 steps on 10,000 interpolation / extrapolation samples;
# interpolation U[1, 2], extrapolation U[2, 6]; per-seed data streams.
TRAIN = {"batch_size": 128, "eval_every": 1000, "loss": "mse",
         "optimizer": {"name": "adam", "lr": 1e-3, "lr_schedule": "constant"},
         "clip": {"mode": "none"}, "reinit": {"enabled": False}}
OFF = {"lambda_max": 0.0, "t_start": 0, "t_end": 1}
# NMU (and gated) runs: λ_max 10, linear warm-up from 1e6 to 2e6 steps of a 5e6-step run
MUL_REG = {"shape": "linear", "lambda_max": 10.0, "t_start": 1_000_000, "t_end": 2_000_000}
# NAU for add/sub: λ_max 0.01 from 5e3 to 5e4 steps (docs/domain/units.md reference defaults)
ADD_REG = {"shape": "linear", "lambda_max": 0.01, "t_start": 5_000, "t_end": 50_000}
GATED = {"unit": "nalu", "options": {"weights": "independent", "add_unit": "nau", "mul_unit": "nmu"}}


@dataclass(frozen=True)
class Model:
    name: str
    layers: list[dict[str, Any]]
    regularizer: dict[str, Any] = field(default_factory=lambda: dict(OFF))


@dataclass(frozen=True)
class Protocol:
    name: str
    title: str
    steps: int
    operations: list[str]
    models: list[Model]
    task: dict[str, Any]  # without the operation
    note: str


PROTOCOLS: dict[str, Protocol] = {
    # The paper's small problem: 2e5 steps. Its reference runs kept the default warm-up
    # (λ from 0 at 1e6 steps), so the sparsity regulariser never acts within 2e5 steps:
    # it is off here. NAC• = NAC+ → NAC•; NALU = NALU → NALU (shared weights, input-
    # dependent gate, log(|x| + ε)); NMU = NAU → NMU.
    "small_mul": Protocol(
        name="small_mul", title="Small multiplication problem, t = (x1+x2+x3+x4)·(x1+x2)",
        steps=200_000, operations=["mul"], task={"kind": "small_mul"},
        models=[
            Model("Linear", [{"unit": "linear"}, {"unit": "linear"}]),
            Model("NAC•", [{"unit": "nac_add"}, {"unit": "nac_mul"}]),
            Model("NALU", [{"unit": "nalu"}, {"unit": "nalu"}]),
            Model("NMU", [{"unit": "nau"}, {"unit": "nmu"}]),
        ],
        note="regulariser off (λ = 0), as in the paper's 2e5-step runs",
    ),
    # The arithmetic datasets task: 5e6 steps. Both layers are the named unit unless the
    # model says otherwise; NAU/NMU/gated are regularised as in MUL_REG / ADD_REG.
    "arithmetic": Protocol(
        name="arithmetic", title="Arithmetic datasets task (100 inputs)",
        steps=5_000_000, operations=["add", "sub", "mul", "div"], task={"kind": "arithmetic"},
        models=[
            Model("Linear", [{"unit": "linear"}, {"unit": "linear"}]),
            Model("NAC+", [{"unit": "nac_add"}, {"unit": "nac_add"}]),
            Model("NAC•", [{"unit": "nac_add"}, {"unit": "nac_mul"}]),
            Model("NALU", [{"unit": "nalu"}, {"unit": "nalu"}]),
            Model("NAU", [{"unit": "nau"}, {"unit": "nau"}], ADD_REG),
            Model("NMU", [{"unit": "nau"}, {"unit": "nmu"}], MUL_REG),
            Model("Gated NAU/NMU", [GATED, GATED], MUL_REG),
        ],
        note="NAU: λ 0.01, 5e3→5e4; NMU and gated NAU/NMU: λ 10, 1e6→2e6; others unregularised",
    ),
}

INITIALISATION = "philox"
"""Where the initial weights come from (`service.seeding.InitStream`); a result without the
field was drawn with per-seed torch generators, before these streams."""

# -- the published figures ------------------------------------------------------------------------
# (success %, its +/− interval, solved_at median, solved_at mean (+/−), sparsity error mean (±)),
# as printed in the paper; None where the paper prints "—" (no solved seed) or has no row.
PUBLISHED: dict[str, dict[tuple[str, str], tuple[str, str, str, str]]] = {
    "small_mul": {  # the paper's "very-simple-function-results" table (no Linear row)
        ("mul", "NAC•"): ("13% (+8/−5)", "5.5e4", "5.9e4 (+7.8e3/−6.6e3)", "7.5e-6 (±2.0e-6)"),
        ("mul", "NALU"): ("26% (+9/−8)", "7.0e4", "7.8e4 (+6.2e3/−8.6e3)", "9.2e-6 (±1.7e-6)"),
        ("mul", "NMU"): ("94% (+3/−6)", "1.4e4", "1.4e4 (+2.2e2/−2.1e2)", "2.6e-8 (±6.4e-9)"),
    },
    "arithmetic": {  # Table 1 and the appendix's table of every model
        ("mul", "NAC•"): ("31% (+10/−8)", "2.8e6", "3.0e6 (+2.9e5/−2.4e5)", "5.8e-4 (+4.8e-4/−2.6e-4)"),
        ("mul", "NMU"): ("98% (+1/−5)", "1.4e6", "1.5e6 (+5.0e4/−6.6e4)", "4.2e-7 (±2.9e-8)"),
        **{("mul", m): ("0% (+4/−0)", "—", "—", "—")
           for m in ("Linear", "NAC+", "NALU", "NAU", "Gated NAU/NMU")},
        **{("div", m): ("0% (+4/−0)", "—", "—", "—")
           for m in ("Linear", "NAC+", "NAC•", "NALU", "NAU", "NMU", "Gated NAU/NMU")},
        ("add", "NAC+"): ("100% (+0/−4)", "2.5e5", "4.9e5 (+5.2e4/−4.5e4)", "2.3e-1 (±6.5e-3)"),
        ("add", "Linear"): ("100% (+0/−4)", "6.1e4", "6.3e4 (+2.5e3/−3.3e3)", "2.5e-1 (±3.6e-4)"),
        ("add", "NALU"): ("14% (+8/−5)", "1.5e6", "1.6e6 (+3.8e5/−3.3e5)", "1.7e-1 (+2.7e-2/−2.5e-2)"),
        ("add", "NAU"): ("100% (+0/−4)", "1.8e4", "3.9e5 (+4.5e4/−3.7e4)", "3.2e-5 (±1.3e-5)"),
        **{("add", m): ("0% (+4/−0)", "—", "—", "—") for m in ("NAC•", "NMU", "Gated NAU/NMU")},
        ("sub", "NAC+"): ("100% (+0/−4)", "9.0e3", "3.7e5 (±3.8e4)", "2.3e-1 (±5.4e-3)"),
        ("sub", "Linear"): ("7% (+7/−4)", "3.3e6", "1.4e6 (+7.0e5/−6.1e5)", "1.8e-1 (+7.2e-2/−5.8e-2)"),
        ("sub", "NALU"): ("14% (+8/−5)", "1.9e6", "1.9e6 (+4.4e5/−4.5e5)", "2.1e-1 (±2.2e-2)"),
        ("sub", "NAU"): ("100% (+0/−4)", "5.0e3", "1.6e5 (+1.7e4/−1.6e4)", "6.6e-2 (+2.5e-2/−1.9e-2)"),
        ("sub", "NMU"): ("56% (+9/−10)", "1.0e6", "1.0e6 (±5.8e2)", "3.4e-4 (+3.2e-5/−2.6e-5)"),
        **{("sub", m): ("0% (+4/−0)", "—", "—", "—") for m in ("NAC•", "Gated NAU/NMU")},
    },
}
OP_SYMBOL = {"add": "+", "sub": "−", "mul": "×", "div": "÷"}
COLUMNS = ["op", "model", "success [95% CI]", "solved_at median", "solved_at mean [95% CI]",
           "sparsity error [95% CI]", "diverged", "final sparsity error",
           "paper: success", "paper: solved_at median", "paper: solved_at mean", "paper: sparsity error"]


def scaled_regularizer(reg: dict[str, Any], steps: int, protocol_steps: int) -> dict[str, Any]:
    """The warm-up at the same fractions of a shortened run (unchanged at full length)."""
    if steps == protocol_steps or reg["lambda_max"] == 0:
        return dict(reg)
    start = round(reg["t_start"] * steps / protocol_steps)
    end = max(start + 1, round(reg["t_end"] * steps / protocol_steps))
    return {**reg, "t_start": start, "t_end": end}


def run_config(protocol: Protocol, op: str, model: Model, seeds: int, steps: int, device: str) -> RunConfig:
    """The `RunConfig` of one (operation, model) cell; raises if it does not validate."""
    task = dict(protocol.task)
    if task["kind"] != "small_mul":
        task["operation"] = op
    return RunConfig.model_validate({
        "task": task,
        "model": {"layers": model.layers, "hidden_size": 2},
        "train": {**TRAIN, "steps": steps,
                  "eval_every": min(TRAIN["eval_every"], steps),
                  "regularizer": scaled_regularizer(model.regularizer, steps, protocol.steps)},
        "seeds": seeds, "seed_offset": 0, "master_seed": 0, "device": device, "compile": "auto",
    })


# -- formatting ---------------------------------------------------------------------------------
def _num(value: float | None) -> str:
    """Like the paper: two significant digits in scientific notation (``5.5e4``)."""
    if value is None or not math.isfinite(value):
        return "—"
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _ci(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f" [{_num(low)}, {_num(high)}]"


def cells(agg: dict[str, Any]) -> dict[str, str]:
    """Our columns from an `AggregateMetrics` dump."""
    return {
        "success [95% CI]": f"{agg['success_rate']:.0%} [{agg['success_ci_low']:.0%}, {agg['success_ci_high']:.0%}]"
                            f" ({agg['successes']}/{agg['n_seeds']})",
        "solved_at median": _num(agg.get("solved_at_median")),
        "solved_at mean [95% CI]": _num(agg.get("solved_at_mean"))
        + _ci(agg.get("solved_at_mean_ci_low"), agg.get("solved_at_mean_ci_high")),
        "sparsity error [95% CI]": _num(agg.get("sparsity_error_mean"))
        + _ci(agg.get("sparsity_error_ci_low"), agg.get("sparsity_error_ci_high")),
        "diverged": str(agg["diverged"]),
        "final sparsity error": _num(agg.get("final_sparsity_error_mean")),
    }


def published_cells(protocol: str, op: str, model: str) -> dict[str, str]:
    row = PUBLISHED.get(protocol, {}).get((op, model))
    keys = ["paper: success", "paper: solved_at median", "paper: solved_at mean", "paper: sparsity error"]
    return dict(zip(keys, row if row else ("no row",) * 4))


def markdown(rows: list[dict[str, str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r.get(c, "") for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def print_table(title: str, rows: list[dict[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in COLUMNS:
        table.add_column(c, justify="left" if c in ("op", "model") else "right")
    for r in rows:
        table.add_row(*[r.get(c, "") for c in COLUMNS])
    Console(width=250).print(table)


# -- running ------------------------------------------------------------------------------------
def not_available(protocol: Protocol, op: str, model: Model, e: Exception) -> dict[str, Any]:
    """The row of a cell whose configuration does not validate (or cannot be built)."""
    reason = " ".join(str(e).split())[:300]
    print(f"  {op} {model.name}: not available ({type(e).__name__}: {reason})", flush=True)
    base = {"op": OP_SYMBOL[op], "model": model.name, **published_cells(protocol.name, op, model.name)}
    return {"row": {**base, "success [95% CI]": "not available"}, "status": "not available",
            "reason": f"{type(e).__name__}: {reason}", "layers": model.layers}


def load_checkpoint(path: Path | None, args: argparse.Namespace, label: str) -> TrainerCheckpoint | None:
    if path is None or not getattr(args, "resume", False) or not path.exists():
        return None
    try:
        return TrainerCheckpoint.load(path)
    except CheckpointError as e:
        raise SystemExit(f"error: {label}: {e}; delete {path} to start the cell afresh") from None


def run_group(protocol: Protocol, ops: list[str], model: Model, args: argparse.Namespace,
              checkpoints: dict[str, Path] | None = None) -> dict[str, dict[str, Any]]:
    """Train the cells ``ops`` of ``model`` as one seed batch (`PackedTrainer`: the operation
    a per-seed setting of the task; each cell's seeds train exactly as in a cell of its own)
    and return each cell's result. A cell whose configuration does not validate gets a "not
    available" row. With ``checkpoints`` (a path per operation), each cell's own state is
    saved there every ``args.checkpoint_every`` evaluations, and with ``args.resume`` the
    checkpoints found there are continued (cells at different steps train as separate packs)."""
    out: dict[str, dict[str, Any]] = {}
    configs: dict[str, RunConfig] = {}
    for op in ops:
        try:
            configs[op] = config = run_config(protocol, op, model, args.seeds, args.steps, args.device)
            check_pack([config])
        except Exception as e:  # noqa: BLE001 - e.g. a unit option another change has not added yet
            out[op] = not_available(protocol, op, model, e)
    paths = checkpoints or {}
    resumes = {op: load_checkpoint(paths.get(op), args, f"{op} {model.name}") for op in configs}
    for step in dict.fromkeys(None if r is None else r.step for r in resumes.values()):
        group = [op for op in configs if (resumes[op].step if resumes[op] else None) == step]
        out.update(train_pack(protocol, group, model, [configs[op] for op in group],
                              [resumes[op] for op in group], args, paths))
    return {op: out[op] for op in ops}


def train_pack(protocol: Protocol, ops: list[str], model: Model, configs: list[RunConfig],
               resumes: list[TrainerCheckpoint | None], args: argparse.Namespace,
               paths: dict[str, Path]) -> dict[str, dict[str, Any]]:
    label = f"{','.join(ops)} {model.name}"
    for op, resume in zip(ops, resumes):
        if resume is not None:
            print(f"  {op} {model.name}: resuming from step {resume.step} ({paths[op]})", flush=True)
    engine_used = []
    prepare = None
    if getattr(args, "engine", False):
        def prepare(trainer: Trainer) -> None:
            engine_used.append(attach(trainer, notice=lambda line: print(f"  {label}: {line}")))
    pack = PackedTrainer(configs, prepare=prepare)
    steps = configs[0].train.steps
    marks = {round(steps * k / 10) for k in range(1, 10)}

    def on_eval(members) -> None:  # a line at about every tenth of the run
        for m in members:
            if m.report.checkpoint is not None and ops[m.index] in paths:
                m.report.checkpoint.save(paths[ops[m.index]])
        rep = members[0].report
        if any(rep.step >= k > rep.step - configs[0].train.eval_every for k in marks):
            print(f"    {label}: step {rep.step}/{rep.total_steps}, {rep.elapsed_s:.0f} s", flush=True)

    every = getattr(args, "checkpoint_every", 0) if paths else 0
    started = time.perf_counter()
    try:
        results = pack.run(on_eval, resume_from=resumes, checkpoint_every=every)
    except CheckpointError as e:  # a checkpoint of another configuration
        raise SystemExit(f"error: {label}: {e}; delete the cells' checkpoint.pt to start afresh") from None
    elapsed = time.perf_counter() - started
    engine = bool(engine_used) and all(engine_used)
    seeds = sum(c.seeds for c in configs)
    done = steps - (resumes[0].step if resumes[0] else 0)
    mode = "engine" if engine else "compiled" if results[0].compiled else "eager"
    print(f"  {label}: {seeds} seeds{' as one batch' if len(ops) > 1 else ''}, {elapsed:.0f} s "
          f"({done * seeds / max(elapsed, 1e-9):,.0f} seed·steps/s, {mode})", flush=True)
    out = {}
    for op, config, result in zip(ops, configs, results):
        if op in paths:
            paths[op].unlink(missing_ok=True)  # the cell's JSON is its result from here on
        agg = result.aggregate.model_dump(mode="json")
        print(f"  {op} {model.name}: {agg['successes']}/{agg['n_seeds']} solved", flush=True)
        base = {"op": OP_SYMBOL[op], "model": model.name, **published_cells(protocol.name, op, model.name)}
        out[op] = {
            "row": {**base, **cells(agg)}, "status": "ok", "layers": model.layers,
            "config": config.model_dump(mode="json"), "thresholds": result.thresholds,
            "aggregate": agg, "elapsed_s": elapsed, "device": result.device, "compiled": result.compiled,
            "engine": engine, "trained_with": ops,
            "seeds": [{k: v for k, v in s.model_dump(mode="json").items()
                       if k in ("seed", "success", "best_step", "solved_at", "interpolation_mse",
                                "extrapolation_mse", "sparsity_error", "final_sparsity_error", "diverged")}
                      for s in result.seeds],
        }
    return out


def run_cell(protocol: Protocol, op: str, model: Model, args: argparse.Namespace,
             checkpoint: Path | None = None) -> dict[str, Any]:
    """One (operation, model) cell on its own (`run_group` of one operation)."""
    return run_group(protocol, [op], model, args, {op: checkpoint} if checkpoint else None)[op]


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Protocol, list[str], list[Model]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("protocol", choices=sorted(PROTOCOLS))
    parser.add_argument("--seeds", type=int, default=100, help="seeds per model (the papers: 100)")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    parser.add_argument("--steps", type=int, default=None,
                        help="override the protocol's length, for a quick check (not the paper's protocol)")
    parser.add_argument("--out", type=Path, default=Path("reproduce-out"), help="output folder")
    parser.add_argument("--models", default=None, help="comma-separated subset of the protocol's models")
    parser.add_argument("--ops", default=None, help="comma-separated subset of the protocol's operations")
    parser.add_argument("--jobs", type=int, default=1,
                        help="models (or, with --cell-by-cell, cells) trained at once, each in its own "
                             "process: the models side by side on one GPU (on one H100, cell by cell: "
                             "2 gave about 1.3x the seed·steps/s of 1, 6 no more than 2; README)")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="FILE",
                        help="write the table from these PROTOCOL.json files of earlier runs; no training")
    parser.add_argument("--checkpoint-every", type=int, default=250, metavar="K",
                        help="save each cell's trainer state every K evaluations, to "
                             "DIR/cells/<cell>/checkpoint.pt (0: never; default 250)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the cells already finished under DIR/cells and continue the "
                             "others from their checkpoints (same seeds and length)")
    parser.add_argument("--engine", action="store_true",
                        help="train the cells the device engine covers on it (service.engine: a GPU "
                             "with Triton; docs/engine.md); the others on the torch path")
    parser.add_argument("--cell-by-cell", action="store_true",
                        help="train each (operation, model) cell on its own, not a model's operations "
                             "as one seed batch (the same per-seed results, more launches)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # a --jobs child: its cells under OUT/cells
    args = parser.parse_args(argv)
    protocol = PROTOCOLS[args.protocol]
    args.steps = args.steps or protocol.steps
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be 0 (never) or more")
    models = protocol.models
    if args.models:
        wanted = [m.strip() for m in args.models.split(",")]
        unknown = set(wanted) - {m.name for m in models}
        if unknown:
            parser.error(f"unknown model(s) {sorted(unknown)}; the protocol has {[m.name for m in models]}")
        models = [m for m in models if m.name in wanted]
    ops = protocol.operations
    if args.ops:
        ops = [o.strip() for o in args.ops.split(",")]
        if set(ops) - set(protocol.operations):
            parser.error(f"unknown operation(s); the protocol has {protocol.operations}")
    return args, protocol, ops, models


def machine() -> str:
    """What trained: the accelerator (or processor) and torch, for the JSON's reader."""
    import platform

    import torch

    where = torch.cuda.get_device_name() if torch.cuda.is_available() else (platform.processor() or platform.machine())
    return f"{where}, torch {torch.__version__}"


def cell_dir(out: Path, op: str, model: Model) -> Path:
    """Where a ``--jobs`` child writes one cell: ``OUT/cells/<op>-<model>``, file-name safe
    (NAC+ and NAC• are ``NAC_add`` and ``NAC_mul``)."""
    name = model.name.replace("+", "_add").replace("•", "_mul")
    return out / "cells" / f"{op}-{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}"


def cell_files(args: argparse.Namespace, protocol: Protocol, op: str, model: Model) -> tuple[Path, Path]:
    """(result JSON, checkpoint) of one cell, in ``OUT/cells/<cell>/``."""
    folder = cell_dir(args.out, op, model)
    return folder / f"{protocol.name}.json", folder / "checkpoint.pt"


def groups(todo: list[tuple[str, Model]], args: argparse.Namespace) -> list[tuple[list[str], Model]]:
    """The cells to train, a model's operations together as one seed batch (one group per
    cell with ``--cell-by-cell``), in the protocol's order of models."""
    if getattr(args, "cell_by_cell", False):
        return [([op], m) for op, m in todo]
    by_model: dict[str, tuple[list[str], Model]] = {}
    for op, m in todo:
        by_model.setdefault(m.name, ([], m))[0].append(op)
    return list(by_model.values())


def kept_cell(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A finished cell of an earlier run (``--resume``), if it has this run's seeds and length."""
    payload = json.loads(path.read_text())
    if (payload.get("seeds"), payload.get("steps")) != (args.seeds, args.steps):
        raise SystemExit(f"error: {path} has {payload.get('seeds')} seeds × {payload.get('steps')} steps, "
                         f"this run {args.seeds} × {args.steps}: use another --out, or drop --resume")
    return payload["cells"][0]


def run_in_processes(protocol: Protocol, todo: list[tuple[list[str], Model]],
                     args: argparse.Namespace) -> dict[tuple[str, str], dict[str, Any]]:
    """Every group of cells in a child process of this script, ``args.jobs`` at a time (the
    models side by side on one GPU); a child that fails leaves "failed" rows (its output
    says why) and the others go on."""
    todo = list(todo)
    running: list[tuple[list[str], Model, subprocess.Popen]] = []
    results: dict[tuple[str, str], dict[str, Any]] = {}
    while todo or running:
        while todo and len(running) < args.jobs:
            ops, m = todo.pop(0)
            cmd = [sys.executable, str(Path(__file__).resolve()), protocol.name, "--ops", ",".join(ops),
                   "--models", m.name, "--seeds", str(args.seeds), "--steps", str(args.steps),
                   "--device", args.device, "--out", str(args.out),
                   "--checkpoint-every", str(args.checkpoint_every), "--child"] + (["--resume"] if args.resume else [])
            cmd += ["--engine"] if args.engine else []
            cmd += ["--cell-by-cell"] if args.cell_by_cell else []
            running.append((ops, m, subprocess.Popen(cmd)))
        time.sleep(0.2)
        for entry in [r for r in running if r[2].poll() is not None]:
            running.remove(entry)
            ops, m, proc = entry
            for op in ops:
                path = cell_dir(args.out, op, m) / f"{protocol.name}.json"
                if proc.returncode == 0 and path.exists():
                    results[op, m.name] = json.loads(path.read_text())["cells"][0]
                    continue
                print(f"  {op} {m.name}: failed (exit status {proc.returncode})", flush=True)
                results[op, m.name] = {"row": {"op": OP_SYMBOL[op], "model": m.name,
                                               **published_cells(protocol.name, op, m.name),
                                               "success [95% CI]": "failed"},
                                       "status": "failed", "layers": m.layers}
    return results


def merged_cells(protocol: Protocol, files: list[Path], seeds: int, steps: int) -> list[dict[str, Any]]:
    """The cells of earlier runs in the protocol's order; a cell none of them has is "not
    run". Runs of another protocol, seed count or length cannot share a table."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    symbol_op = {v: k for k, v in OP_SYMBOL.items()}
    for f in files:
        try:
            payload = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: cannot read {f}: {e}") from None
        got = (payload.get("protocol"), payload.get("seeds"), payload.get("steps"))
        if got != (protocol.name, seeds, steps):
            raise SystemExit(f"error: {f} is protocol {got[0]} with {got[1]} seeds × {got[2]} steps; "
                             f"this table is {protocol.name} with {seeds} × {steps} "
                             "(give --seeds/--steps to match)")
        for cell in payload["cells"]:
            key = (symbol_op[cell["row"]["op"]], cell["row"]["model"])
            if key in found:
                raise SystemExit(f"error: the cell {key[0]} {key[1]} is in more than one file; keep one")
            found[key] = cell
    cells = []
    for op in protocol.operations:
        for m in protocol.models:
            cells.append(found.get((op, m.name)) or {
                "row": {"op": OP_SYMBOL[op], "model": m.name, **published_cells(protocol.name, op, m.name),
                        "success [95% CI]": "not run"},
                "status": "not run", "layers": m.layers})
    return cells


def write_outputs(folder: Path, protocol: Protocol, args: argparse.Namespace, results: list[dict[str, Any]],
                  elapsed_s: float, title: str) -> None:
    """``folder/PROTOCOL.json`` (settings, cells, the machine) and ``folder/PROTOCOL.md`` (the table)."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "protocol": protocol.name, "title": protocol.title, "note": protocol.note,
        "seeds": args.seeds, "steps": args.steps, "protocol_steps": protocol.steps,
        "shortened": args.steps != protocol.steps, "device": args.device, "train": TRAIN,
        "initialisation": INITIALISATION,
        "elapsed_s": elapsed_s, "machine": machine(), "columns": COLUMNS, "cells": results,
    }
    if args.merge:
        payload["merged_from"] = [str(f) for f in args.merge]
        payload["device"] = sorted({str(r.get("device")) for r in results if r["status"] == "ok"})
        machines: set[str] = set()
        for f in args.merge:  # a run's own (str) or a merged file's (list)
            got = json.loads(f.read_text()).get("machine", "not recorded")
            machines.update([got] if isinstance(got, str) else got)
        payload["machine"] = sorted(machines)
    (folder / f"{protocol.name}.json").write_text(json.dumps(payload, indent=1, allow_nan=False))
    (folder / f"{protocol.name}.md").write_text(
        f"## {title}\n\nSettings: {protocol.note}; Adam lr 1e-3, batch 128, evaluation every "
        f"{min(1000, args.steps)} steps; sparsity error over solved seeds at their best-validation step.\n\n"
        + markdown([r["row"] for r in results]) + "\n")


def main(argv: list[str] | None = None) -> int:
    args, protocol, ops, models = parse_args(argv)
    shortened = args.steps != protocol.steps
    title = (f"{protocol.title} — {args.seeds} seeds × {args.steps:,} steps"
             f"{' (SHORTENED)' if shortened else ''}; paper: 100 seeds × {protocol.steps:,} steps")
    started = time.perf_counter()
    if args.merge:
        results = merged_cells(protocol, args.merge, args.seeds, args.steps)
        print(f"{protocol.title}: {sum(r['status'] == 'ok' for r in results)} of {len(results)} cells "
              f"from {len(args.merge)} file(s)", flush=True)
    else:
        unit = "cells" if args.cell_by_cell else "models"
        together = "" if args.cell_by_cell or len(ops) == 1 else "; a model's operations as one seed batch"
        print(f"{protocol.title}: {len(models)} models × {len(ops)} ops × {args.seeds} seeds × {args.steps} steps"
              f"{' (shortened: not the paper protocol)' if shortened else ''}; {protocol.note}{together}"
              f"{f'; {args.jobs} {unit} at a time' if args.jobs > 1 else ''}", flush=True)
        done: dict[tuple[str, str], dict[str, Any]] = {}
        todo: list[tuple[str, Model]] = []
        for op in ops:
            for m in models:
                result_file, _ = cell_files(args, protocol, op, m)
                if args.resume and not args.child and result_file.exists():
                    done[op, m.name] = kept_cell(result_file, args)
                    print(f"  {op} {m.name}: kept from {result_file}", flush=True)
                else:
                    todo.append((op, m))
        if args.jobs > 1:
            done.update(run_in_processes(protocol, groups(todo, args), args))
        for group_ops, m in groups(todo, args) if args.jobs == 1 else []:
            files = {op: cell_files(args, protocol, op, m) for op in group_ops}
            group_started = time.perf_counter()
            trained = run_group(protocol, group_ops, m, args,
                                {op: f[1] for op, f in files.items()} if args.checkpoint_every else None)
            for op, cell in trained.items():  # each finished cell kept apart, for --resume and --merge
                done[op, m.name] = cell
                write_outputs(files[op][0].parent, protocol, args, [cell], time.perf_counter() - group_started, title)
        if args.child:  # its cells are written; the parent writes the table
            return 0
        results = [done[op, m.name] for op in ops for m in models]

    print_table(title, [r["row"] for r in results])
    write_outputs(args.out, protocol, args, results, time.perf_counter() - started, title)
    print(f"wrote {args.out / (protocol.name + '.json')} and {args.out / (protocol.name + '.md')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
