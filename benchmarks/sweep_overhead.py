"""What a sweep costs on top of its training: a sweep of N fixed trials against the same N
configurations trained by `nalu-sweep run`, one after the other, in one run.

Every command runs as a fresh process, as a user runs it. The N trials are fixed (a grid
over N learning rates, no scheduler, one trial at a time), so the sweep trains exactly
what the N runs train. A second sweep of one trial separates what a sweep pays once
(the driver's imports, the MLflow store and experiment, Ray's start, the trial worker's
start and imports — Tune reuses that worker for the next trials — and Ray's stop: the
*fixed* cost) from what it pays per trial (the MLflow run, checkpoints, plots, Tune's
bookkeeping):

    one more trial = (sweep(N) − sweep(1)) / (N − 1)
    fixed     = sweep(1) − one more trial      (what is left of sweep(1) after its trial)
    per-trial = one more trial − training       (the training as the runs timed it: the
                                                 trials train the same configurations)

The fixed cost is measured against nothing: a sweep of no trials would pay it. A
`nalu-sweep run` pays its own process start and imports besides its training; the sweep's
trials share one worker process, so they do not.

`--baseline REV` measures an earlier revision of this repository the same way, alternating
with the working tree in each repetition (its tree exported with `git archive`), so that a
figure can be read against the code it is compared with on the same machine in the same
hour: this machine's speed drifts by more than some changes.

Usage: python benchmarks/sweep_overhead.py [--trials 2] [--seeds 32] [--steps 20000] [--repeat 1]
                                           [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def timed(cmd: list[str], cwd: Path, code: Path) -> float:
    """Wall seconds of ``cmd`` running the package in ``code``; the CPU seconds of its process
    tree go to ``CPU``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]),
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


def sweep(root: Path, trials: int, args: argparse.Namespace, code: Path) -> float:
    where = root / f"sweep{trials}"
    where.mkdir()
    path = where / "space.yaml"
    path.write_text(yaml.safe_dump(space(trials, args.seeds, args.steps, args.eval_every)))
    return timed([sys.executable, "-m", "service", "sweep", str(path)], where, code)


def runs(root: Path, trials: int, args: argparse.Namespace, code: Path) -> list[float]:
    where = root / "runs"
    where.mkdir()
    walls = []
    for i, lr in enumerate(LRS[:trials]):
        path = where / f"run{i}.yaml"
        path.write_text(yaml.safe_dump(run_config(lr, args.seeds, args.steps, args.eval_every)))
        walls.append(timed([sys.executable, "-m", "service", "run", str(path), "--quiet",
                            "--output", str(where / f"result{i}.json")], where, code))
    return walls


def measure(args: argparse.Namespace, n: int, code: Path = REPO) -> dict[str, float]:
    """One repetition of the code in ``code``: the N runs, the sweep of 1 trial and the sweep
    of N, each a fresh process in a fresh directory; wall and CPU seconds and what follows."""
    CPU.clear()
    with tempfile.TemporaryDirectory(prefix="nalu-sweep-overhead-") as tmp:
        root = Path(tmp)
        run_walls = runs(root, n, args, code)
        one = sweep(root, 1, args, code)
        many = sweep(root, n, args, code)
        trained = [json.loads((root / "runs" / f"result{i}.json").read_text())["elapsed_s"] for i in range(n)]
    cpu = list(CPU.values())  # the runs, then sweep(1), then sweep(N)
    one_more = (many - one) / (n - 1)
    training = sum(trained) / n
    one_more_cpu = (cpu[n + 1] - cpu[n]) / (n - 1)
    return {"runs": sum(run_walls), "per_run": sum(run_walls) / n, "training": training,
            "run_walls": run_walls, "trained": trained, "one": one, "many": many, "one_more": one_more,
            "fixed": one - one_more, "per_trial": one_more - training, "runs_cpu": sum(cpu[:n]),
            "run_cpus": cpu[:n], "one_cpu": cpu[n], "many_cpu": cpu[n + 1], "one_more_cpu": one_more_cpu,
            "fixed_cpu": cpu[n] - one_more_cpu}


def report(m: dict[str, float], n: int) -> None:
    print(f"  nalu-sweep run × {n}:   {m['runs']:7.1f} s  ({', '.join(f'{w:.1f}' for w in m['run_walls'])}); "
          f"training inside each (its elapsed_s): {', '.join(f'{t:.1f}' for t in m['trained'])} s")
    print(f"  nalu-sweep sweep, 1 trial:  {m['one']:7.1f} s")
    print(f"  nalu-sweep sweep, {n} trials: {m['many']:7.1f} s  → ratio {m['many'] / m['runs']:.2f} against the "
          f"{n} runs")
    print(f"  one more trial in a sweep: {m['one_more']:.1f} s (a `nalu-sweep run`: {m['per_run']:.1f} s, process "
          f"start and imports included)")
    print(f"  fixed cost:     {m['fixed']:6.1f} s  (target: under 10 s)")
    print(f"  per-trial cost: {m['per_trial']:6.1f} s  beyond the training; {m['per_trial'] / 30:.1%} of a "
          f"30-second trial (target: under 5%), {m['per_trial'] / max(m['training'], 1e-9):.1%} of this "
          f"{m['training']:.1f}-second one; a run pays {m['per_run'] - m['training']:.1f} s")
    print(f"  CPU seconds (each command's process tree): runs {m['runs_cpu']:.1f} "
          f"({', '.join(f'{c:.1f}' for c in m['run_cpus'])}), sweep(1) {m['one_cpu']:.1f}, sweep({n}) "
          f"{m['many_cpu']:.1f} → ratio {m['many_cpu'] / m['runs_cpu']:.2f}; one more trial "
          f"{m['one_more_cpu']:.1f}, fixed {m['fixed_cpu']:.1f}")


def export(rev: str, into: Path) -> Path:
    """The tree of revision ``rev`` of this repository, written under ``into``."""
    tree = into / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=False, capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"--baseline {rev}: git archive failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    if not (tree / "service" / "__main__.py").is_file():
        sys.exit(f"--baseline {rev}: that revision has no service/__main__.py to run")
    return tree


def summarize(reps: list[dict], n: int, label: str) -> None:
    """The median of each figure over the repetitions, and the fixed cost's range."""
    keys = [k for k, v in reps[0].items() if isinstance(v, float)]
    median = {k: statistics.median(m[k] for m in reps) for k in keys}
    median.update({k: [statistics.median(m[k][i] for m in reps) for i in range(n)]
                   for k in ("run_walls", "trained", "run_cpus")})
    print(f"{label}median of {len(reps)} repetitions (each figure on its own); fixed cost "
          f"{min(m['fixed'] for m in reps):.1f}–{max(m['fixed'] for m in reps):.1f} s, per-trial cost "
          f"{min(m['per_trial'] for m in reps):.1f}–{max(m['per_trial'] for m in reps):.1f} s:")
    report(median, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2, help="N, at most 8")
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1,
                        help="repetitions of the whole measurement; with more than one, each is printed and then "
                             "the median of each figure (on a noisy machine one repetition's fixed cost can be off "
                             "by several seconds: it is the difference of two sweeps)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also measure this git revision (e.g. e2743e8, when this benchmark was added), "
                             "alternating with the working tree; it must take the same `sweep` and `run` commands")
    args = parser.parse_args()
    n = max(2, min(args.trials, len(LRS)))
    with tempfile.TemporaryDirectory(prefix="nalu-sweep-baseline-") as tmp:
        trees = {"": REPO}
        if args.baseline:
            trees = {f"{args.baseline}: ": export(args.baseline, Path(tmp)), "working tree: ": REPO}
        reps: dict[str, list[dict]] = {label: [] for label in trees}
        for r in range(max(1, args.repeat)):
            for label, code in trees.items():
                reps[label].append(measure(args, n, code))
                print(f"{label}{n} trials × {args.seeds} seeds × {args.steps} steps (eager, one at a time); load "
                      f"{os.getloadavg()[0]:.1f}" + (f"; repetition {r + 1} of {args.repeat}" if args.repeat > 1 else ""))
                report(reps[label][-1], n)
    for label, measured in reps.items():
        if len(measured) > 1:
            summarize(measured, n, label)


if __name__ == "__main__":
    main()
