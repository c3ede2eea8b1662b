"""What a sweep costs on top of its training: a sweep of N fixed trials against the same N
configurations trained by `nalu-sweep run`, one after the other, in one run.

Every command runs as a fresh process, as a user runs it. The N trials are fixed (a grid
over N learning rates, no scheduler, one trial at a time), so the sweep trains exactly
what the N runs train. A second sweep of one trial separates what a sweep pays once
(Ray start, MLflow store and experiment, the driver's imports: the *fixed* cost) from what
it pays per trial (the worker's set-up, the MLflow run, checkpoints, artifacts):

    overhead(N) = sweep(N) − N · run,   overhead(1) = sweep(1) − run
    per-trial   = (overhead(N) − overhead(1)) / (N − 1),   fixed = overhead(1) − per-trial

Usage: python benchmarks/sweep_overhead.py [--trials 2] [--seeds 32] [--steps 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LRS = [0.01, 0.012, 0.014, 0.016, 0.018, 0.02, 0.022, 0.024]

TASK = {"kind": "arithmetic", "operation": "mul"}
FIXED = {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
         "train": {"batch_size": 128, "optimizer": {"name": "adam"}}}


def space(trials: int, seeds: int, steps: int, eval_every: int) -> dict:
    return {"name": f"overhead{trials}", "task": TASK, "fixed": FIXED,
            "params": {"lr": {"type": "categorical", "choices": LRS[:trials], "target": "train.optimizer.lr"}},
            "seeds": seeds, "steps": steps, "eval_every": eval_every, "trials": trials, "concurrency": 1,
            "scheduler": {"type": "none"}, "sampler": {"type": "grid"}, "resources": {"cpus": 1, "gpus": 0}}


def run_config(lr: float, seeds: int, steps: int, eval_every: int) -> dict:
    train = {**FIXED["train"], "optimizer": {"name": "adam", "lr": lr}, "steps": steps, "eval_every": eval_every}
    return {"task": TASK, **FIXED, "train": train, "seeds": seeds}


CPU: dict[str, float] = {}  # CPU seconds of each command's process tree, in call order


def _tree_cpu(proc: subprocess.Popen) -> float:
    """Wait for ``proc``, sampling the CPU time of it and every descendant (Ray's GCS,
    raylet and workers included) every 0.2 s; returns their sum at the last sample of each.
    CPU seconds are what a busy shared machine inflates far less than wall time."""
    import psutil

    seen: dict[int, float] = {}
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                t = p.cpu_times()
                seen[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        time.sleep(0.2)
    return sum(seen.values())


def timed(cmd: list[str], cwd: Path) -> float:
    """Wall seconds of ``cmd``; the CPU seconds of its process tree go to ``CPU``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    import threading

    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    cpu = _tree_cpu(proc)
    wall = time.perf_counter() - start
    reader.join()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{''.join(out)[-4000:]}")
    CPU[f"{cmd[3]}:{cwd.name}:{cmd[4]}"] = cpu
    return wall


def sweep(root: Path, trials: int, args: argparse.Namespace) -> float:
    where = root / f"sweep{trials}"
    where.mkdir()
    path = where / "space.yaml"
    path.write_text(yaml.safe_dump(space(trials, args.seeds, args.steps, args.eval_every)))
    return timed([sys.executable, "-m", "service", "sweep", str(path)], where)


def runs(root: Path, trials: int, args: argparse.Namespace) -> list[float]:
    where = root / "runs"
    where.mkdir()
    walls = []
    for i, lr in enumerate(LRS[:trials]):
        path = where / f"run{i}.yaml"
        path.write_text(yaml.safe_dump(run_config(lr, args.seeds, args.steps, args.eval_every)))
        walls.append(timed([sys.executable, "-m", "service", "run", str(path), "--quiet",
                            "--output", str(where / f"result{i}.json")], where))
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2, help="N, at most 8")
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--eval-every", type=int, default=1000)
    args = parser.parse_args()
    n = max(2, min(args.trials, len(LRS)))
    with tempfile.TemporaryDirectory(prefix="nalu-sweep-overhead-") as tmp:
        root = Path(tmp)
        run_walls = runs(root, n, args)
        one = sweep(root, 1, args)
        many = sweep(root, n, args)
        trained = [json.loads((root / "runs" / f"result{i}.json").read_text())["elapsed_s"] for i in range(n)]
    run_total, per_run = sum(run_walls), sum(run_walls) / n
    over_n, over_1 = many - run_total, one - run_walls[0]
    per_trial = (over_n - over_1) / (n - 1)
    fixed = over_1 - per_trial
    print(f"{n} trials × {args.seeds} seeds × {args.steps} steps (eager, one at a time); load {os.getloadavg()[0]:.1f}")
    print(f"  nalu-sweep run × {n}:   {run_total:7.1f} s  ({', '.join(f'{w:.1f}' for w in run_walls)})")
    print(f"  nalu-sweep sweep, 1 trial:  {one:7.1f} s")
    print(f"  nalu-sweep sweep, {n} trials: {many:7.1f} s  → ratio {many / run_total:.2f}")
    print(f"  fixed cost:     {fixed:6.1f} s")
    print(f"  per-trial cost: {per_trial:6.1f} s  ({per_trial / per_run:.1%} of a {per_run:.0f}-second run)")
    cpu = list(CPU.values())  # the runs, then sweep(1), then sweep(N)
    run_cpu, one_cpu, many_cpu = sum(cpu[:n]), cpu[n], cpu[n + 1]
    per_trial_cpu = ((many_cpu - run_cpu) - (one_cpu - cpu[0])) / (n - 1)
    print(f"  CPU seconds: runs {run_cpu:.1f} ({', '.join(f'{c:.1f}' for c in cpu[:n])}), sweep(1) {one_cpu:.1f}, "
          f"sweep({n}) {many_cpu:.1f} → ratio {many_cpu / run_cpu:.2f}; fixed "
          f"{(one_cpu - cpu[0]) - per_trial_cpu:.1f} s, per trial {per_trial_cpu:.1f} s "
          f"({per_trial_cpu / (run_cpu / n):.1%} of a run)")
    print(f"  training inside each run (its elapsed_s): {', '.join(f'{t:.1f}' for t in trained)} s; the rest of a "
          f"run (process start, imports, data, writing) {per_run - sum(trained) / n:.1f} s; sweep(1) minus "
          f"training {one - trained[0]:.1f} s")
    print(f"  one more trial in a sweep: {(many - one) / (n - 1):.1f} s wall, {(many_cpu - one_cpu) / (n - 1):.1f} s CPU "
          f"(a `nalu-sweep run`, process start included: {per_run:.1f} s wall, {run_cpu / n:.1f} s CPU)")


if __name__ == "__main__":
    main()
