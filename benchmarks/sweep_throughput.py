"""Seed·steps/s of a whole sweep, unpacked and packed (`pack: K`), measured in one run.

A fixed sweep — N trials × S seeds × T steps of the papers' arithmetic mul task
(NAU → NMU, 100 inputs, batch 128), trials differing in learning rate and λ_max (both
per-seed settings, so any K trials can pack), random sampler, no early stopping — is run
through the real CLI (`nalu-sweep sweep`, Ray + Optuna + MLflow, a fresh process and a
fresh local store each time) for each pack size K. Every variant trains exactly
N · S · T seed·steps; the figure is that over the sweep's wall time, start-up included.

On a GPU, ``--gpus-per-trial 1,0.5,0.25,0.125`` adds unpacked sweeps with 1/2/4/8 trials
sharing one GPU (Ray's fractional GPUs; concurrency = trials per GPU).

Usage:
    python benchmarks/sweep_throughput.py [--trials 32] [--seeds 16] [--steps 20000]
        [--packs 1,4,8,16] [--device cpu|cuda] [--gpus-per-trial ...] [--json out.json]
    python benchmarks/sweep_throughput.py --level trainer [--engine] ...   # the training
        loop alone: the trials in PackedTrainers of K against Trainers one after another
        (``--engine``: on the device engine, as a GPU sweep trains them), and the next
        pack of K − 1 (``next_pack_s``: compiled, it should cost (K − 1)/K of the first
        less its set-up, ``next_pack_if_no_setup_s`` for comparison)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TASK = {"kind": "arithmetic", "operation": "mul"}


def fixed(device: str, steps: int) -> dict:
    return {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": device, "compile": "auto",
            "train": {"batch_size": 128, "optimizer": {"name": "adam"},
                      "regularizer": {"lambda_max": 1.0, "t_start": steps // 5, "t_end": 2 * steps // 5}}}


PARAMS = {"lr": {"type": "loguniform", "low": 1e-3, "high": 3e-2, "target": "train.optimizer.lr"},
          "lambda_max": {"type": "loguniform", "low": 0.1, "high": 10.0, "target": "train.regularizer.lambda_max"}}


def space(args, pack: int, gpus: float, concurrency: int) -> dict:
    return {"name": f"throughput-p{pack}-g{gpus:g}", "task": TASK, "fixed": fixed(args.device, args.steps),
            "params": PARAMS, "seeds": args.seeds, "steps": args.steps, "eval_every": args.eval_every,
            "trials": args.trials, "concurrency": concurrency, "pack": pack, "checkpoint_every": 0,
            "scheduler": {"type": "none"}, "sampler": {"type": "random", "seed": 0},
            "resources": {"cpus": args.cpus_per_trial, "gpus": gpus}}


def run_sweep(args, pack: int, gpus: float, concurrency: int) -> dict:
    """One sweep as a fresh CLI process in a fresh directory: wall seconds and seed·steps/s."""
    with tempfile.TemporaryDirectory(prefix="nalu-throughput-") as tmp:
        path = Path(tmp) / "space.yaml"
        path.write_text(yaml.safe_dump(space(args, pack, gpus, concurrency)))
        cmd = [sys.executable, "-m", "service", "sweep", str(path), "--tracking-uri",
               f"sqlite:///{tmp}/mlflow.db", "--storage-path", f"{tmp}/runs"]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"sweep (pack {pack}, gpus {gpus}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    seed_steps = args.trials * args.seeds * args.steps
    return {"pack": pack, "gpus_per_trial": gpus, "concurrency": concurrency, "wall_s": round(wall, 1),
            "seed_steps_per_s": round(seed_steps / wall)}


def trainer_level(args, pack: int) -> dict:
    """The training loop alone: ``--trials`` trials in packs of ``pack`` (`PackedTrainer`)
    against the same trials trained one after another (`Trainer`), in this process, one
    thread; with ``--engine``, on the device engine where it covers them, as a sweep on a
    GPU trains them (`service.engine.attach_on_gpu`)."""
    import torch

    from service.config import RunConfig
    from service.training import Trainer
    from service.training.packing import PackedTrainer

    prepare = None
    if args.engine:
        from service.engine import attach_on_gpu as prepare
    torch.set_num_threads(1)
    trials = max(pack, args.trials)
    members = []
    for k in range(trials):
        data = {"task": TASK, **fixed(args.device, args.steps), "seeds": args.seeds}
        data["train"] = {**data["train"], "steps": args.steps, "eval_every": args.eval_every,
                         "optimizer": {"name": "adam", "lr": 1e-3 * (1.1 ** (k % 16))}}
        members.append(RunConfig.model_validate(data))
    groups = [members[i:i + pack] for i in range(0, trials, pack)]
    started = time.perf_counter()
    PackedTrainer(groups[0], prepare=prepare).run()
    first = time.perf_counter() - started
    for group in groups[1:]:
        PackedTrainer(group, prepare=prepare).run()
    packed = time.perf_counter() - started
    row: dict = {"trials": trials, "engine": bool(args.engine), "first_pack_s": round(first, 1)}
    if pack > 1:  # the next pack, one member fewer (a pruned trial): compiled, it reuses the step
        started = time.perf_counter()
        PackedTrainer(groups[0][1:], prepare=prepare).run()
        row.update({"next_pack_s": round(time.perf_counter() - started, 1),
                    "next_pack_if_no_setup_s": round(first * (pack - 1) / pack, 1)})
    started = time.perf_counter()
    for member in members:
        trainer = Trainer(member)
        if prepare is not None:
            prepare(trainer)
        trainer.run()
    alone = time.perf_counter() - started
    seed_steps = trials * args.seeds * args.steps
    return {"pack": pack, "packed_s": round(packed, 1), "one_by_one_s": round(alone, 1),
            "packed_seed_steps_per_s": round(seed_steps / packed),
            "one_by_one_seed_steps_per_s": round(seed_steps / alone), "ratio": round(alone / packed, 2), **row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--level", choices=["sweep", "trainer"], default="sweep")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--eval-every", type=int, default=2_000)
    parser.add_argument("--packs", default="1,4,8,16")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--cpus-per-trial", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=0,
                        help="trials (groups, when packed) in flight; 0: the CPU count / cpus per trial")
    parser.add_argument("--gpus-per-trial", default="", help="e.g. 1,0.5,0.25,0.125: unpacked sweeps sharing one GPU")
    parser.add_argument("--engine", action="store_true",
                        help="--level trainer: train on the device engine where it covers the model (a GPU)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    packs = [int(k) for k in args.packs.split(",") if k]
    rows: list[dict] = []
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {args.trials} trials × "
          f"{args.seeds} seeds × {args.steps} steps on {args.device}", flush=True)
    if args.level == "trainer":
        for k in packs:
            rows.append(trainer_level(args, k))
            print(rows[-1], flush=True)
    else:
        concurrency = args.concurrency or max(1, int((os.cpu_count() or 1) // args.cpus_per_trial))
        gpus = 0.0 if args.device == "cpu" else 1.0
        for k in packs:
            rows.append(run_sweep(args, k, gpus, concurrency))
            print(rows[-1], flush=True)
        for share in [float(g) for g in args.gpus_per_trial.split(",") if g]:
            rows.append(run_sweep(args, 1, share, max(1, round(1 / share))))
            print(rows[-1], flush=True)
        base = next((r for r in rows if r["pack"] == 1 and r["gpus_per_trial"] in (0.0, 1.0)), None)
        if base:
            for r in rows:
                r["vs_unpacked"] = round(r["seed_steps_per_s"] / base["seed_steps_per_s"], 2)
        print(f"{'pack':>5} {'gpus/trial':>10} {'wall s':>8} {'seed·steps/s':>13} {'× unpacked':>10}")
        for r in rows:
            print(f"{r['pack']:>5} {r['gpus_per_trial']:>10g} {r['wall_s']:>8} {r['seed_steps_per_s']:>13} "
                  f"{r.get('vs_unpacked', ''):>10}")
    if args.json:
        import torch

        device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                       else platform.processor() or platform.machine())
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "torch": torch.__version__,
                                         "device_name": device_name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
