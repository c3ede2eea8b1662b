"""Wall time of the read-only verbs (`status`, `status NAME`, `best`, `compare`) on a store
of a 60-trial sweep, each run as a fresh `python -m service` process, as a user would.

The store is written directly through the MLflow client, shaped like a sweep's (one parent
run tagged ``role=sweep`` with the sweep's params and its resolved search space as an
artifact; one child run per trial tagged ``role=trial`` under it, with the trial's params,
a history of every metric at each evaluation, and its outcome), so no training runs.
A second, smaller sweep is there for `compare`. Usage:

    python benchmarks/readonly_verbs.py [--trials 60] [--repeat 3] [--dir DIR]

Prints one line per verb: the best and median wall time of ``--repeat`` runs and the
median CPU time (user + system) of the process, in seconds. On a shared machine the CPU
time is the steadier figure: the wall time grows with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPACE = REPO / "search_spaces" / "smoke.yaml"
EVALS = 8  # evaluations logged per trial (a 2,000-step trial evaluated every 250 steps)


def build_store(directory: Path, name: str, trials: int, seed: int = 0) -> str:
    """A SQLite MLflow store in ``directory`` holding the sweep ``name`` of ``trials`` trials."""
    import yaml
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from service.tracking import store

    uri = f"sqlite:///{directory.resolve() / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    root = (directory.resolve() / "mlruns").as_uri()
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name, artifact_location=f"{root}/{name}")
    raw = yaml.safe_load(SPACE.read_text())
    searched = list(raw["params"])
    parent = client.create_run(exp_id, run_name=name, tags={
        store.TAG_ROLE: store.ROLE_SWEEP, store.TAG_SWEEP: name, store.TAG_OUTCOME: "completed",
        store.TAG_SPACE_HASH: "bench", store.TAG_GIT_COMMIT: "bench"}).info.run_id
    client.log_batch(parent, params=[Param(k, str(v)) for k, v in {
        "trials": trials, "seeds": 4, "steps": 2000, "eval_every": 250, "concurrency": 2,
        "scheduler": "asha", "objective": "success_ci_low", "sampler": "tpe", "cpus_per_trial": 1,
        "gpus_per_trial": 0, "searched": ", ".join(searched), "tasks": "small_mul"}.items()])
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "resolved_spec.json"
        spec.write_text(json.dumps({**raw, "trials": trials}))
        client.log_artifact(parent, str(spec), "search_space")
    rng = random.Random(seed)
    for i in range(trials):
        opt = rng.choice(["adam", "rmsprop", "sgd"])
        params = {"lr": 10 ** rng.uniform(-2, -0.5), "optimizer": opt, "lambda_max": 10 ** rng.uniform(-2, 0),
                  "nau_init": rng.choice(["default", "xavier_uniform", "uniform(-0.5, 0.5)"]),
                  "task.kind": "small_mul", "task.interpolation": "U[1,2]", "task.extrapolation.extrapolation": "U[2,6]",
                  "seeds": 4, "steps": 2000, "eval_every": 250}
        if opt == "sgd":
            params["momentum"] = rng.uniform(0.5, 0.95)
        outcome = rng.choices(["completed", "pruned", "failed"], [0.7, 0.25, 0.05])[0]
        run = client.create_run(exp_id, run_name=f"trial_{i:05d}", tags={
            store.TAG_PARENT: parent, store.TAG_ROLE: store.ROLE_TRIAL, store.TAG_TRIAL_KEY: f"t{i:05d}",
            store.TAG_SWEEP: name, store.TAG_ATTEMPTS: "1", store.TAG_OUTCOME: outcome}).info.run_id
        now = int(time.time() * 1000)
        metrics = []
        evals = EVALS if outcome == "completed" else EVALS // 2
        for e in range(1, evals + 1):
            k = min(4, rng.randint(0, e))
            low = [0.0, 0.046, 0.15, 0.3, 0.51][k]
            for key, value in {"successes": k, "n_seeds": 4, "success_rate": k / 4, "success_ci_low": low,
                               "success_ci_high": min(1.0, low + 0.49), "objective": low + 1e-6 * rng.random(),
                               "diverged": 0, "solved_at_median": 250.0 * e, "sparsity_error_mean": rng.random() / 10,
                               "interpolation_mse_median": 10 ** rng.uniform(-9, -1),
                               "extrapolation_mse_median.extrapolation": 10 ** rng.uniform(-9, 1),
                               "training_step": 250.0 * e}.items():
                metrics.append(Metric(key, float(value), now, 250 * e))
        client.log_batch(run, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()],
                         tags=[RunTag(store.TAG_METRIC_POINTS, str(len(metrics)))])
        client.set_terminated(run, status={"failed": "FAILED"}.get(outcome, "FINISHED"))
    client.set_terminated(parent, status="FINISHED")
    return uri


def time_verb(args: list[str], cwd: Path, repeat: int) -> tuple[float, float, float, str]:
    """(best wall s, median wall s, median CPU s of the process, last output)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "COLUMNS": "100"}
    times, cpu, out = [], [], ""
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "service", *args], cwd=cwd, env=env,
                              capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{out}")
    return min(times), statistics.median(times), statistics.median(cpu), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="Keep the store here (default: a temporary folder).")
    parser.add_argument("--show", action="store_true", help="Print each verb's output once.")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nalu-bench-") as tmp:
        directory = opts.dir or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        build_store(directory, "bench", opts.trials)
        build_store(directory, "other", max(1, opts.trials // 6), seed=1)
        print(f"store: {opts.trials} + {max(1, opts.trials // 6)} trials in {directory} "
              f"(built in {time.perf_counter() - start:.1f} s)")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; seconds over {opts.repeat} runs")
        print(f"{'verb':<28} {'best':>7} {'median':>7} {'CPU':>7}")
        for args in (["--help"], ["status"], ["status", "bench"], ["best", "bench"], ["compare", "bench", "other"]):
            low, mid, cpu, out = time_verb(args, directory, opts.repeat)
            print(f"{' '.join(args):<28} {low:7.2f} {mid:7.2f} {cpu:7.2f}", flush=True)
            if opts.show:
                print(out)


if __name__ == "__main__":
    main()
