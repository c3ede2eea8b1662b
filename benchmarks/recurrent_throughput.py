"""Seed·steps/s of the seed-batched recurrent trainer against a plain one-seed loop.

Same ratio method as `benchmarks/throughput.py`: (a) the straightforward one-seed torch
loop a researcher would write (float32, torch.optim.Adam, torch.rand / torch.randint data,
the same read-out and cell, the sparsity and R_z regularisers, clamping) against (b) the
batched `RecurrentTrainer` at S = 1, 10, 100 (each seed with its own data stream). Both
include evaluation every 1000 steps on the task's fixed sets (validation at the training
length, test up to the longest test length): training steps and one evaluation are timed
separately and combined as ``1 / (t_step + t_eval / 1000)``.

Tasks: ``sequence_arithmetic`` (sum, 4 inputs, NAU read-out → NAU cell, length 10, test up
to 1000) and ``sequential_digits`` (sum, 8×8 images, MLP 64→32→1 read-out → NAU cell).

With ``--steps N`` (or ``--device cuda``, N = 2000 by default there) it times whole runs
instead, as ``nalu-sweep run --task T --operation sum --seeds S --steps N`` trains them
(evaluation every 1000 steps, ``compile: auto``: on a GPU compiled and replayed from CUDA
graphs): each S twice in one process, the first run with compiling included ("cold"), the
second without ("warm").

Usage:
    python benchmarks/recurrent_throughput.py [--task sequence_arithmetic|sequential_digits]
                                              [--seconds 3] [--seeds 1,10,100] [--threads 1]
                                              [--device cpu|cuda] [--steps N] [--units A,B]
                                              [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from service.config import RunConfig
from service.training import Trainer

EVAL_EVERY = 1000


def config(task: str, seeds: int) -> RunConfig:
    return RunConfig.model_validate({
        "task": {"kind": task, "operation": "sum"},
        "train": {"steps": 1_000_000, "batch_size": 64, "eval_every": EVAL_EVERY},
        "seeds": seeds, "device": "cpu",
    })


def run_rates(task_name: str, seeds: int, steps: int, device: str, units: str = "") -> dict:
    """Whole runs of ``steps`` steps (the CLI's defaults, batch as ``nalu-sweep run``):
    seed·steps/s with compiling (the first run of this shape in the process) and without.
    ``units``: the layers as ``--units`` names them (default: the task's model)."""
    layers = [{"unit": u.strip()} for u in units.split(",")] if units else None
    cfg = RunConfig.model_validate({"task": {"kind": task_name, "operation": "sum"}, "seeds": seeds,
                                    "model": {"layers": layers}, "device": device, "train": {"steps": steps}})
    row: dict = {"task": task_name, "units": units or "default", "seeds": seeds, "steps": steps, "device": device}
    for label in ("cold", "warm"):
        started = time.perf_counter()
        trainer = Trainer(cfg)
        result = trainer.run()
        wall = time.perf_counter() - started
        row[f"{label}_s"] = round(wall, 2)
        row[f"{label}_seed_steps_per_s"] = round(seeds * steps / wall)
        row["compiled"], row["cuda_graphs"] = result.compiled, getattr(trainer, "_graph", None) is not None
    return row


def _timed(fn, seconds: float, minimum: int = 1) -> float:
    """Seconds per call of ``fn`` (after one warm-up call)."""
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or n < minimum:
        fn()
        n += 1
    return (time.perf_counter() - start) / n


def reference_rate(task_name: str, seconds: float) -> float:
    """Steps/s of a plain one-seed loop (evaluation every 1000 steps included)."""
    cfg = config(task_name, 1)
    task = cfg.task
    g = torch.Generator().manual_seed(0)
    digits = task_name == "sequential_digits"
    if digits:
        train = task.split("train")
        w1 = torch.empty(32, 64).uniform_(-0.125, 0.125, generator=g).requires_grad_()
        b1 = torch.zeros(32, requires_grad=True)
        w2 = torch.empty(1, 32).uniform_(-0.17, 0.17, generator=g).requires_grad_()
        b2 = torch.zeros(1, requires_grad=True)
        readout_params = [w1, b1, w2, b2]

        def read(x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ w1.t() + b1) @ w2.t() + b2
    else:
        w1 = torch.empty(1, task.input_size).uniform_(-0.5, 0.5, generator=g).requires_grad_()
        readout_params = [w1]

        def read(x: torch.Tensor) -> torch.Tensor:
            return x @ w1.t()
    cell = torch.empty(1, 2).uniform_(-0.5, 0.5, generator=g).requires_grad_()
    opt = torch.optim.Adam([*readout_params, cell], lr=1e-3)
    lo, hi = task.interpolation.intervals[0]

    def unroll(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.zeros(z.shape[0], 1)
        outs, total = [], 0
        for t in range(z.shape[1]):
            inp = torch.cat((z[:, t], h), -1)
            total = total + inp.mean(0)
            h = inp @ cell.t()
            outs.append(h)
        return torch.stack(outs, 1), total / z.shape[1]

    def step() -> None:
        if digits:
            idx = torch.randint(train.labels.numel(), (64, task.train_length), generator=g)
            x, t = train.images[idx], train.labels[idx].float().cumsum(1).unsqueeze(-1)
        else:
            x = torch.rand(64, task.train_length, task.input_size, generator=g) * (hi - lo) + lo
            t = x[..., :2].sum(-1).cumsum(1).unsqueeze(-1)
        z = read(x.reshape(-1, x.shape[-1])).view(64, task.train_length, 1)
        y, zmean = unroll(z)
        reg = torch.minimum(cell.abs(), 1 - cell.abs()).mean()
        rz = ((1 - cell.abs()) * zmean.square()).mean()
        loss = (y - t).square().mean() + 0.01 * reg + rz
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            cell.clamp_(-1, 1)
            if not digits:
                w1.clamp_(-1, 1)

    sets = task.sequence_sets()

    @torch.no_grad()
    def evaluate() -> None:
        for data in sets.values():
            last = max(data.lengths.values())
            z = read(data.table if digits else data.inputs[:, :last].reshape(-1, task.input_size))
            z = z[data.inputs[:, :last]] if digits else z.view(-1, last, 1)
            h = torch.zeros(z.shape[0], 1)
            for t in range(last):
                h = torch.cat((z[:, t], h), -1) @ cell.t()

    t_step = _timed(step, seconds, 20)
    t_eval = _timed(evaluate, seconds / 2)
    return 1.0 / (t_step + t_eval / EVAL_EVERY)


def batched_rate(task_name: str, seeds: int, seconds: float) -> float:
    trainer = Trainer(config(task_name, seeds))
    t_step = _timed(trainer.train_step, seconds, 5)
    t_eval = _timed(trainer.evaluate, seconds / 2)
    return seeds / (t_step + t_eval / EVAL_EVERY)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="sequence_arithmetic", choices=["sequence_arithmetic", "sequential_digits"])
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    p.add_argument("--seeds", default="1,10,100")
    p.add_argument("--threads", default="1")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=0,
                   help="time whole runs of this many steps (default on cuda: 2000) instead of the ratio method")
    p.add_argument("--units", default="", help="with --steps: the layers, e.g. nau,lstm (default: the task's)")
    p.add_argument("--json", type=Path, help="write the measurements here (JSON)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    steps = args.steps or (2000 if args.device == "cuda" else 0)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    print(f"machine: {device_name}, torch {torch.__version__}, task={args.task}")
    out = {"task": args.task, "device": args.device, "device_name": device_name, "torch": torch.__version__,
           "rows": []}
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        if steps:
            print(f"\n[{threads} thread(s)] whole runs of {steps} steps on {args.device}")
            for s in map(int, args.seeds.split(",")):
                row = {"threads": threads, **run_rates(args.task, s, steps, args.device, args.units)}
                out["rows"].append(row)
                print(row, flush=True)
            continue
        ref = reference_rate(args.task, args.seconds)
        print(f"\n[{threads} thread(s)] reference one-seed loop: {ref:,.0f} steps/s")
        print(f"{'S':>6} {'seed·steps/s':>14} {'× reference':>12}")
        for s in map(int, args.seeds.split(",")):
            rate = batched_rate(args.task, s, args.seconds)
            out["rows"].append({"threads": threads, "seeds": s, "seed_steps_per_s": round(rate),
                                "reference_steps_per_s": round(ref), "ratio": round(rate / ref, 2)})
            print(f"{s:>6} {rate:>14,.0f} {rate / ref:>12.1f}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
