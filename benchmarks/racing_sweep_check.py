"""A real racing sweep against the replay, on settings of the ground truth (issue 44, item 5).

    python benchmarks/racing.py sweep-check [--ground-truth FILE] [--out FILE]

Runs ``nalu-sweep sweep`` (real Ray Tune, Optuna's grid sampler, MLflow in a scratch
SQLite store, the default race: sign test, blocks of 8 up to 64 seeds, ``concurrency: 1``)
over the ground truth's settings that form a grid of one parameter: Adam at λ_max 0.1 and
the default NAU init, the learning rates 0.01 … 0.3. Then it checks, setting by setting:

* every seed the sweep trained succeeded or not exactly as in the ground truth (trained
  as one batch of 256 seeds, the sweep in blocks of 8, 8, 16, 32: seed k is a seed);
* the sweep's standings — who left, why and after how many seeds, and the pick — are those
  of `race.replay` on the ground truth's outcomes over seeds 0 … 63, the settings arriving
  in the order the sweep's grid sampler proposed them. (A replaced incumbent is compared
  by its reason only: the sweep trains the incumbent ahead to the maximum.)

It prints a table and writes it as JSON (``benchmarks/results/racing_sweep_check.json``).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from service.scoring.race import Outcome, RaceSpec, replay

ROOT = Path(__file__).resolve().parents[1]
GRID = {"optimizer": "adam", "lambda_max": 0.1, "nau_init": "default"}  # the fixed part; lr varies
SPEC = RaceSpec()  # the default race (`--scheduler race`)
NAME = "racing-check"


def grid_settings(truth: dict[str, Any]) -> list[dict[str, Any]]:
    """The ground truth's settings on the one-parameter grid (Adam, λ_max 0.1, default init)."""
    return [s for s in truth["settings"]
            if all(s["params"].get(k) == v for k, v in GRID.items()) and "momentum" not in s["params"]]


def sweep_space(settings: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "search_spaces" / "smoke.yaml").read_text())
    data["fixed"]["train"]["optimizer"] = {"name": "adam"}
    data["fixed"]["train"]["regularizer"]["lambda_max"] = GRID["lambda_max"]
    data["params"] = {"lr": {"type": "categorical", "choices": [s["params"]["lr"] for s in settings],
                             "target": "train.optimizer.lr"}}
    data.update(name=NAME, trials=len(settings), concurrency=1, steps=steps, sampler={"type": "grid", "seed": 0},
                scheduler={"type": "race"})
    return data


def run_sweep(space: dict[str, Any], workdir: Path) -> float:
    """``nalu-sweep sweep`` in its own process, as a user runs it; returns its wall time."""
    (workdir / "space.yaml").write_text(yaml.safe_dump(space))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / 'mlflow.db'}"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "service", "sweep", "space.yaml", "--storage-path",
                           str(workdir / "runs")], cwd=workdir, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"error: the sweep failed (exit {done.returncode}):\n{done.stdout[-4000:]}")
    return time.perf_counter() - start


def sweep_records(workdir: Path) -> list[dict[str, Any]]:
    """Each trial's lr, Optuna number, standing, seeds and per-seed successes, in the order
    the sampler proposed them."""
    from service.tracking import runs, store

    client = store.client(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(NAME)
    parent = runs.find_sweep_run(client, experiment.experiment_id, NAME)
    out = []
    for run in runs.trial_runs(client, experiment.experiment_id, parent.info.run_id):
        with tempfile.TemporaryDirectory() as tmp:
            rows = list(csv.DictReader(Path(client.download_artifacts(run.info.run_id, "seeds.csv", tmp)).open()))
        out.append({"lr": float(run.data.params["lr"]), "number": int(run.data.tags[store.TAG_OPTUNA_TRIAL]),
                    "standing": run.data.tags.get(store.TAG_RACE_EXIT, ""),
                    "seeds": int(run.data.metrics["n_seeds"]),
                    "success": "".join("1" if r["success"] == "True" else "0"
                                       for r in sorted(rows, key=lambda r: int(r["seed"])))})
    return sorted(out, key=lambda r: r["number"])


def compare(settings: list[dict[str, Any]], records: list[dict[str, Any]], spec: RaceSpec = SPEC) -> dict[str, Any]:
    """The sweep's records against the ground truth and `race.replay` on it (module docstring)."""
    truth = {s["params"]["lr"]: s for s in settings}
    order = [r["lr"] for r in records]
    outcomes = {lr: [Outcome(c == "1", max(0.0, x) if x is not None else float("nan"))
                     for c, x in zip(s["success"], s["log10_error_ratio"])] for lr, s in truth.items()}
    played = replay(outcomes, order, list(range(spec.max_seeds)), spec)
    rows = []
    for r in records:
        s = truth[r["lr"]]
        exit_ = played.exits.get(r["lr"])
        expected = "incumbent" if played.pick == r["lr"] else exit_.reason
        expected_seeds = played.seeds[r["lr"]]
        same_seeds = r["success"] == s["success"][:r["seeds"]]
        same_standing = r["standing"] == expected and (expected in ("incumbent", "replaced")
                                                       or r["seeds"] == expected_seeds)
        rows.append({"lr": r["lr"], "true_rate": s["success"].count("1") / len(s["success"]),
                     "sweep": {"standing": r["standing"], "seeds": r["seeds"],
                               "successes": r["success"].count("1")},
                     "replay": {"standing": expected, "seeds": expected_seeds},
                     "seeds_as_ground_truth": same_seeds, "standing_as_replay": same_standing})
    return {"order": order, "pick": {"sweep": next((r["lr"] for r in records if r["standing"] == "incumbent"), None),
                                     "replay": played.pick},
            "rows": rows, "agree": all(r["seeds_as_ground_truth"] and r["standing_as_replay"] for r in rows)}


def print_table(result: dict[str, Any]) -> None:
    print("| lr (in the sampler's order) | true rate (256 seeds) | sweep: standing, seeds (successes) "
          "| replay: standing, seeds | seeds as the ground truth | standing as the replay |")
    print("|---|---|---|---|---|---|")
    for r in result["rows"]:
        sw, rp = r["sweep"], r["replay"]
        print(f"| {r['lr']} | {r['true_rate']:.3f} | {sw['standing']}, {sw['seeds']} ({sw['successes']}) "
              f"| {rp['standing']}, {rp['seeds']} | {'yes' if r['seeds_as_ground_truth'] else 'NO'} "
              f"| {'yes' if r['standing_as_replay'] else 'NO'} |")
    print(f"\npick: sweep {result['pick']['sweep']}, replay {result['pick']['replay']}; "
          f"{result['seeds_trained']} seeds trained in {result['wall_s']:.0f} s -> "
          f"{'the sweep races as the replay' if result['agree'] else 'MISMATCH'}")


def main(ground_truth: Path, out: Path | None) -> int:
    truth = json.loads(ground_truth.read_text())
    settings = grid_settings(truth)
    if len(settings) < 2:
        raise SystemExit(f"error: {ground_truth} holds fewer than two settings of the grid {GRID}")
    with tempfile.TemporaryDirectory(prefix="nalu-sweep-racing-check-") as tmp:
        wall = run_sweep(sweep_space(settings, int(truth["steps"])), Path(tmp))
        records = sweep_records(Path(tmp))
    result = compare(settings, records)
    result.update(wall_s=round(wall, 1), seeds_trained=sum(r["seeds"] for r in records),
                  command="python benchmarks/racing.py sweep-check")
    print_table(result)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["agree"] else 1
