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

Both sweeps are measured twice: *cold*, with no Ray running (the sweep starts one with
`ray.init()` and stops it) and a new MLflow store (created by the sweep: MLflow's schema
migrations, about 0.6 s here), and *warm*, with a local cluster kept up by `ray start --head`
(the sweep joins it and leaves it running; its workers idle in Ray's pool, as after an
earlier sweep) and the MLflow store of earlier sweeps (the two warm sweeps share a working
directory whose ``mlflow.db`` exists), as for someone who sweeps often. The warm cluster is this benchmark's own: started in a temp directory of its
own (``RAY_TMPDIR``), found only by the sweeps given it, and stopped by killing its own
process group; its processes' CPU time during a sweep counts as the sweep's.

`--baseline REV` (one or more times) measures an earlier revision of this repository the same way, alternating
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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


def process_group(pgid: int | None) -> list:
    """The processes of process group ``pgid`` (a warm cluster's: its GCS and raylet; not
    the raylet's workers, which start sessions of their own); none for None."""
    import psutil

    if pgid is None:
        return []
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return found


def _tree_cpu(proc: subprocess.Popen, cluster: int | None = None) -> float:
    """Wait for ``proc``, sampling the CPU time of it and every descendant (Ray's GCS,
    raylet and workers included) every 0.2 s, and of the warm cluster's process group
    ``cluster`` and its descendants (its raylet and workers: not the sweep's); returns the CPU each
    spent meanwhile (its last sample less its first, for a process running before).
    CPU seconds are what a busy shared machine inflates far less than wall time."""
    import psutil

    def cpu(p) -> float:
        t = p.cpu_times()
        return t.user + t.system

    def cluster_procs() -> list:
        found = []
        for p in process_group(cluster):
            try:
                found += [p, *p.children(recursive=True)]
            except psutil.Error:
                pass
        return found

    before: dict[int, float] = {}
    for p in cluster_procs():
        try:
            before[p.pid] = cpu(p)
        except psutil.Error:
            pass
    seen: dict[int, float] = {}
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True), *cluster_procs()]
        except psutil.Error:
            procs = cluster_procs()
        for p in procs:
            try:
                seen[p.pid] = cpu(p)
            except psutil.Error:
                pass
        time.sleep(0.2)
    return sum(v - before.get(pid, 0.0) for pid, v in seen.items())


def timed(cmd: list[str], cwd: Path, code: Path, env: dict[str, str] | None = None,
          cluster: int | None = None) -> float:
    """Wall seconds of ``cmd`` running the package in ``code`` (in ``env``, this process's by
    default); the CPU seconds of its process tree (and of the warm ``cluster``) go to ``CPU``."""
    env = {**(env or os.environ), "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    import threading

    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    try:
        cpu = _tree_cpu(proc, cluster)
    except BaseException:  # interrupted: the command does not outlive the benchmark
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    wall = time.perf_counter() - start
    reader.join()
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{''.join(out)[-4000:]}")
    CPU[f"{cmd[3]}:{cwd.name}:{cmd[4]}"] = cpu
    return wall


@contextmanager
def local_cluster(code: Path) -> Iterator[tuple[dict[str, str], int]]:
    """``ray start --head`` (2 CPUs, no dashboard) for the package in ``code``, in a temp
    directory and process group of its own; yields the environment that finds it and the
    group's id, after one driver connected (its workers then idle in Ray's pool). Stops that
    group, and only it, at the end."""
    temp = tempfile.mkdtemp(prefix="nalu-bench-ray-", dir="/tmp")  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=temp, RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]))
    head = subprocess.Popen([str(Path(sys.executable).with_name("ray")), "start", "--head", "--num-cpus", "2",
                             "--include-dashboard=false", "--disable-usage-stats"], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = head.communicate(timeout=180)
        if head.returncode != 0:
            sys.exit(f"ray start --head failed:\n{out[-4000:]}")
        subprocess.run([sys.executable, "-c", "import ray; ray.init(); ray.get(ray.remote(lambda: 0).remote())"],
                       env=env, check=True, capture_output=True, timeout=180)
        yield env, head.pid
    finally:
        import psutil

        for sig in (signal.SIGTERM, signal.SIGKILL):
            procs = process_group(head.pid)
            if not procs:
                break
            try:
                os.killpg(head.pid, sig)
            except ProcessLookupError:
                break
            psutil.wait_procs(procs, timeout=3)  # what ignores SIGTERM that long is killed
        import shutil

        shutil.rmtree(temp, ignore_errors=True)


def existing_store(where: Path) -> None:
    """The MLflow store (``./mlflow.db``, a sweep's default) of ``where`` created, as an earlier
    sweep leaves it: MLflow creates a new store's tables through its ~50 schema migrations."""
    where.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-c", "from mlflow import MlflowClient; "
                    "MlflowClient('sqlite:///mlflow.db').search_experiments()"],
                   cwd=where, check=True, capture_output=True, timeout=180)


def sweep(root: Path, trials: int, args: argparse.Namespace, code: Path, warm: tuple[dict[str, str], int] | None = None,
          ) -> float:
    """A cold sweep runs in a directory of its own (a new MLflow store); the warm ones share a
    directory whose store exists already (`existing_store`), as someone who sweeps often has."""
    if warm:
        where = root / "warm"
        path = where / f"space{trials}.yaml"
    else:
        where = root / f"sweep{trials}"
        where.mkdir()
        path = where / "space.yaml"
    path.write_text(yaml.safe_dump(space(trials, args.seeds, args.steps, args.eval_every)))
    env, cluster = warm if warm else (None, None)
    return timed([sys.executable, "-m", "service", "sweep", str(path)], where, code, env, cluster)


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


def measure(args: argparse.Namespace, n: int, code: Path = REPO) -> dict[str, dict[str, float]]:
    """One repetition of the code in ``code``: the N runs, then the sweep of 1 trial and the
    sweep of N cold (no Ray running, each in a fresh directory) and warm (`local_cluster`,
    in one directory with an existing store), each a fresh process; wall and CPU seconds and
    what follows, cold and warm."""
    CPU.clear()
    out = {}
    with tempfile.TemporaryDirectory(prefix="nalu-sweep-overhead-") as tmp:
        root = Path(tmp)
        run_walls = runs(root, n, args, code)
        trained = [json.loads((root / "runs" / f"result{i}.json").read_text())["elapsed_s"] for i in range(n)]
        run_cpus = list(CPU.values())
        for mode in ("cold", "warm"):
            CPU.clear()
            if mode == "cold":
                one, many = sweep(root, 1, args, code), sweep(root, n, args, code)
            else:
                existing_store(root / "warm")
                with local_cluster(code) as warm:
                    one, many = sweep(root, 1, args, code, warm), sweep(root, n, args, code, warm)
            one_cpu, many_cpu = CPU.values()
            one_more = (many - one) / (n - 1)
            training = sum(trained) / n
            one_more_cpu = (many_cpu - one_cpu) / (n - 1)
            out[mode] = {"runs": sum(run_walls), "per_run": sum(run_walls) / n, "training": training,
                         "run_walls": run_walls, "trained": trained, "one": one, "many": many, "one_more": one_more,
                         "fixed": one - one_more, "per_trial": one_more - training, "runs_cpu": sum(run_cpus),
                         "run_cpus": run_cpus, "one_cpu": one_cpu, "many_cpu": many_cpu,
                         "one_more_cpu": one_more_cpu, "fixed_cpu": one_cpu - one_more_cpu}
    return out


def report(m: dict[str, float], n: int, mode: str) -> None:
    target = "target: 5 s or less" if mode == "warm" else "what plain Ray costs"
    print(f"  [{mode}] nalu-sweep run × {n}:   {m['runs']:7.1f} s  ({', '.join(f'{w:.1f}' for w in m['run_walls'])}); "
          f"training inside each (its elapsed_s): {', '.join(f'{t:.1f}' for t in m['trained'])} s")
    print(f"  nalu-sweep sweep, 1 trial:  {m['one']:7.1f} s")
    print(f"  nalu-sweep sweep, {n} trials: {m['many']:7.1f} s  → ratio {m['many'] / m['runs']:.2f} against the "
          f"{n} runs")
    print(f"  one more trial in a sweep: {m['one_more']:.1f} s (a `nalu-sweep run`: {m['per_run']:.1f} s, process "
          f"start and imports included)")
    print(f"  fixed cost:     {m['fixed']:6.1f} s  ({target})")
    print(f"  per-trial cost: {m['per_trial']:6.1f} s  beyond the training; {m['per_trial'] / 30:.1%} of a "
          f"30-second trial (target: under 5%), {m['per_trial'] / max(m['training'], 1e-9):.1%} of this "
          f"{m['training']:.1f}-second one; a run pays {m['per_run'] - m['training']:.1f} s")
    print(f"  CPU seconds (each command's process tree): runs {m['runs_cpu']:.1f} "
          f"({', '.join(f'{c:.1f}' for c in m['run_cpus'])}), sweep(1) {m['one_cpu']:.1f}, sweep({n}) "
          f"{m['many_cpu']:.1f} → ratio {m['many_cpu'] / m['runs_cpu']:.2f}; one more trial "
          f"{m['one_more_cpu']:.1f}, fixed {m['fixed_cpu']:.1f}")


def export(rev: str, into: Path) -> Path:
    """The tree of revision ``rev`` of this repository, written under ``into``."""
    tree = into / f"baseline-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=False, capture_output=True)
    if archive.returncode != 0:
        sys.exit(f"--baseline {rev}: git archive failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    if not (tree / "service" / "__main__.py").is_file():
        sys.exit(f"--baseline {rev}: that revision has no service/__main__.py to run")
    return tree


def summarize(reps: list[dict], n: int, label: str, mode: str) -> dict[str, float]:
    """The median of each figure over the repetitions, and the fixed cost's range."""
    keys = [k for k, v in reps[0].items() if isinstance(v, float)]
    median = {k: statistics.median(m[k] for m in reps) for k in keys}
    median.update({k: [statistics.median(m[k][i] for m in reps) for i in range(n)]
                   for k in ("run_walls", "trained", "run_cpus")})
    print(f"{label}{mode}: median of {len(reps)} repetitions (each figure on its own); fixed cost "
          f"{min(m['fixed'] for m in reps):.1f}–{max(m['fixed'] for m in reps):.1f} s, per-trial cost "
          f"{min(m['per_trial'] for m in reps):.1f}–{max(m['per_trial'] for m in reps):.1f} s:")
    report(median, n, mode)
    return median


def table(medians: dict[tuple[str, str], dict[str, float]]) -> None:
    """The medians side by side, as docs/performance.md shows them (markdown)."""
    print("\n| code | Ray | fixed cost (wall s) | fixed cost (CPU s) | per-trial cost (wall s) | "
          "per-trial / 30-s trial |")
    print("|---|---|---|---|---|---|")
    for (label, mode), m in medians.items():
        print(f"| {label.rstrip(': ') or 'working tree'} | {mode} | {m['fixed']:.1f} | {m['fixed_cpu']:.1f} | "
              f"{m['per_trial']:.1f} | {m['per_trial'] / 30:.1%} |")


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
    parser.add_argument("--baseline", metavar="REV", action="append",
                        help="also measure this git revision (e.g. e2743e8, when this benchmark was added), "
                             "alternating with the working tree; it must take the same `sweep` and `run` commands")
    args = parser.parse_args()
    n = max(2, min(args.trials, len(LRS)))
    with tempfile.TemporaryDirectory(prefix="nalu-sweep-baseline-") as tmp:
        trees = {"": REPO}
        if args.baseline:  # each REV given, then the working tree
            trees = {**{f"{rev}: ": export(rev, Path(tmp)) for rev in args.baseline}, "working tree: ": REPO}
        reps: dict[tuple[str, str], list[dict]] = {(label, mode): [] for label in trees for mode in ("cold", "warm")}
        for r in range(max(1, args.repeat)):
            for label, code in trees.items():
                measured = measure(args, n, code)
                print(f"{label}{n} trials × {args.seeds} seeds × {args.steps} steps (eager, one at a time); load "
                      f"{os.getloadavg()[0]:.1f}" + (f"; repetition {r + 1} of {args.repeat}" if args.repeat > 1 else ""))
                for mode, m in measured.items():
                    reps[(label, mode)].append(m)
                    report(m, n, mode)
    medians = {key: summarize(measured, n, *key) if len(measured) > 1 else measured[0]
               for key, measured in reps.items()}
    table(medians)


if __name__ == "__main__":
    main()
