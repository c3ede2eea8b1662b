"""The device engine (`service.engine`) against the torch path: throughput and outcomes.

``rate`` (default): seed·steps/s of NAU → NMU on the papers' arithmetic task (100 inputs,
mul, batch 128) at the papers' evaluation cadence (every 1,000 steps, 10,000 interpolation
and 10,000 extrapolation samples), for each S of ``--seeds``, on the engine and on the torch
path (compiled, CUDA graphs on a GPU; `benchmarks/throughput.py`'s measurement). Targets on
one H100/H200: >= 10 M seed·steps/s at S = 100, >= 20 M at S >= 1,000.

``outcomes``: ``--seeds`` seeds per model of a `benchmarks/reproduce.py` protocol
(``--task``: its settings, the regulariser's warm-up scaled to ``--steps``) trained on each
path of ``--paths``, and per model the agreement: seeds with the same outcome (success or
not) on both paths, and the engine's success rate against the torch path's 95% interval
(NMU: the same outcome for >= 95% of the seeds). The torch path's outcomes can come from an
earlier run (``--torch-json``): this script's JSON, or a `benchmarks/reproduce.py` result,
such as the committed ``benchmarks/reproduce_small_mul.json`` (100 seeds × 200,000 steps).

  python benchmarks/engine_throughput.py rate --device cuda --seeds 100,1000,10000 --seconds 3 --json out.json
  python benchmarks/engine_throughput.py outcomes --device cuda --task small_mul --seeds 100 --steps 50000 \\
      --models NMU,NAC•,Linear --json outcomes.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reproduce  # noqa: E402  (the papers' protocols: every setting written out)
import throughput  # noqa: E402  (the torch path's measurement, shared)

from service.engine import attach  # noqa: E402
from service.training import Trainer  # noqa: E402

TABLE_1 = 7 * 4 * 100 * 5_000_000  # seed·steps of the NAU paper's Table 1 (models × ops × seeds × steps)
AGREEMENT = 0.95  # NMU: share of seeds with the same outcome on both paths


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def engine_rates(seeds: int, seconds: float, device: str,
                 variants: list[tuple[int, int]]) -> list[tuple[float, float, float]]:
    """Per (warps, rows per chunk): (seed·steps/s, set-up seconds incl. compiling the
    kernels, share of the time spent evaluating) of the engine on one trainer, an
    evaluation every 1,000 steps as `Trainer.run` does."""
    t0 = time.perf_counter()
    throughput.DEVICE = device
    trainer = Trainer(throughput.config(seeds, "off"))
    built = time.perf_counter() - t0
    out = []
    for warps, rows in variants:
        t0 = time.perf_counter()
        if not attach(trainer, num_warps=warps, rows_per_chunk=rows):
            raise SystemExit("the engine is not available here")
        trainer.train_steps(1000)
        trainer.evaluate()
        _sync(device)
        setup = time.perf_counter() - t0 + built
        n, evaluating, start = 0, 0.0, time.perf_counter()
        while time.perf_counter() - start < seconds or n == 0:
            t1 = time.perf_counter()
            trainer.evaluate()
            _sync(device)
            evaluating += time.perf_counter() - t1
            trainer.train_steps(1000)
            n += 1000
            _sync(device)
        elapsed = time.perf_counter() - start
        out.append((n * seeds / elapsed, setup, evaluating / elapsed))
        trainer.engine.write_back()
    return out


def rate(args: argparse.Namespace) -> dict:
    rows = []
    for s in map(int, args.seeds.split(",")):
        for path in args.paths.split(","):
            if path == "engine":
                variants = [(int(w), int(r)) for w in args.warps.split(",") for r in args.rows.split(",")]
                measured = engine_rates(s, args.seconds, args.device, variants)
            else:
                throughput.DEVICE = args.device
                variants, measured = [(None, None)], [(*throughput.batched(s, args.seconds, "on", True), None)]
            for (warps, chunk), (r, setup, eval_share) in zip(variants, measured):
                rows.append({"path": path, "seeds": s, "warps": warps, "rows_per_chunk": chunk,
                             "seed_steps_per_s": r, "setup_s": setup, "evaluation_share": eval_share,
                             "table_1_minutes_at_this_rate": TABLE_1 / r / 60})
                tag = f" (warps {warps}, rows {chunk}, evaluating {eval_share:.0%})" if warps else ""
                print(f"{path:>6} S={s:>6}: {r / 1e6:8.2f} M seed·steps/s, set-up {setup:.1f} s{tag}; "
                      f"Table 1 at this rate: {TABLE_1 / r / 60:,.1f} min", flush=True)
    return {"kind": "rate", "rows": rows}


def run_outcomes(args: argparse.Namespace, path: str) -> dict[str, dict]:
    out = {}
    protocol = reproduce.PROTOCOLS[args.task]
    models = {m.name: m for m in protocol.models}
    for name in args.models.split(","):
        if name not in models:
            raise SystemExit(f"--models: {name!r} is not a model of the {args.task} protocol: {sorted(models)}")
        config = reproduce.run_config(protocol, args.operation, models[name], args.seeds, args.steps, args.device)
        trainer = Trainer(config)
        if path == "engine" and not attach(trainer, num_warps=int(args.warps.split(",")[0]),
                                           rows_per_chunk=int(args.rows.split(",")[0])):
            continue
        t0 = time.perf_counter()
        result = trainer.run()
        agg = result.aggregate
        out[name] = {"success": [bool(s.success) for s in result.seeds], "successes": agg.successes,
                     "ci": [agg.success_ci_low, agg.success_ci_high], "seconds": time.perf_counter() - t0}
        print(f"{path:>6} {name:>8}: {agg.successes}/{args.seeds} solved "
              f"(95% CI {agg.success_ci_low:.2f}-{agg.success_ci_high:.2f}), {time.perf_counter() - t0:.1f} s",
              flush=True)
    return out


def torch_reference(path: str, args: argparse.Namespace) -> dict[str, dict]:
    """The torch path's outcomes per model from ``path``: an earlier ``--json`` of this script,
    or a `benchmarks/reproduce.py` result of the same protocol, seeds and length (e.g. the
    committed ``benchmarks/reproduce_small_mul.json``: 100 seeds × 200,000 steps on the CPU)."""
    data = json.loads(Path(path).read_text())
    if "paths" in data:
        return data["paths"]["torch"]
    got = (data.get("protocol"), data.get("seeds"), data.get("steps"))
    if got != (args.task, args.seeds, args.steps):
        raise SystemExit(f"--torch-json {path}: protocol {got[0]}, {got[1]} seeds × {got[2]} steps; this run is "
                         f"{args.task}, {args.seeds} × {args.steps}")
    symbol = reproduce.OP_SYMBOL[args.operation]
    out = {}
    for cell in data["cells"]:
        if cell["status"] == "ok" and cell["row"]["op"] == symbol:
            agg = cell["aggregate"]
            out[cell["row"]["model"]] = {"success": [bool(s["success"]) for s in cell["seeds"]],
                                         "successes": agg["successes"],
                                         "ci": [agg["success_ci_low"], agg["success_ci_high"]],
                                         "from": path}
    return out


def outcomes(args: argparse.Namespace) -> dict:
    paths = {p: run_outcomes(args, p) for p in args.paths.split(",")}
    if args.torch_json:
        paths["torch"] = torch_reference(args.torch_json, args)
    checks = {}
    if "engine" in paths and "torch" in paths:
        for name, eng in paths["engine"].items():
            ref = paths["torch"].get(name)
            if ref is None:
                continue
            if len(ref["success"]) != len(eng["success"]):
                raise SystemExit(f"{name}: {len(ref['success'])} torch-path seeds against {len(eng['success'])}")
            same = sum(a == b for a, b in zip(eng["success"], ref["success"]))
            rate_e = eng["successes"] / len(eng["success"])
            inside = ref["ci"][0] <= rate_e <= ref["ci"][1]
            ok = inside and (name != "NMU" or same >= AGREEMENT * len(eng["success"]))
            checks[name] = {"same_outcome": same, "of": len(eng["success"]), "engine_rate_inside_torch_ci": inside,
                            "ok": ok}
            print(f"{name:>8}: same outcome for {same}/{len(eng['success'])} seeds; engine rate "
                  f"{rate_e:.2f} {'inside' if inside else 'OUTSIDE'} the torch interval -> {'ok' if ok else 'FAIL'}")
    return {"kind": "outcomes", "task": args.task, "operation": args.operation, "steps": args.steps,
            "seeds": args.seeds,
            "paths": paths, "checks": checks}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="rate", choices=["rate", "outcomes"])
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--seeds", default=None, help="rate: S values (default 100,1000); outcomes: seeds per model (100)")
    p.add_argument("--seconds", type=float, default=3.0, help="rate: timed seconds per measurement")
    p.add_argument("--paths", default="engine,torch", help="engine, torch or both")
    p.add_argument("--warps", default="4", help="engine: warps per program (rate: a list to compare)")
    p.add_argument("--rows", default="32", help="engine: batch rows per chunk of a step (rate: a list)")
    p.add_argument("--task", default="small_mul", choices=sorted(reproduce.PROTOCOLS),
                   help="outcomes: the protocol of benchmarks/reproduce.py whose settings are used")
    p.add_argument("--operation", default="mul", help="outcomes, arithmetic: the operation")
    p.add_argument("--models", default="NMU,NAC•,Linear", help="outcomes: the protocol's model names")
    p.add_argument("--steps", type=int, default=50_000,
                   help="outcomes: steps (the protocol's regulariser warm-up scaled to them)")
    p.add_argument("--torch-json", default=None, help="outcomes: the torch path's from an earlier --json, or from "
                   "a benchmarks/reproduce.py result of the same protocol, seeds and steps")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    if args.seeds is None:
        args.seeds = "100,1000" if args.what == "rate" else "100"
    if args.what == "outcomes":
        args.seeds = int(args.seeds)
    where = torch.cuda.get_device_name() if args.device == "cuda" else (platform.processor() or platform.machine())
    print(f"machine: {where}, torch {torch.__version__}, device={args.device}")
    data = rate(args) if args.what == "rate" else outcomes(args)
    data.update(machine=where, torch=torch.__version__, device=args.device)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    if not all(c["ok"] for c in data.get("checks", {}).values()):
        raise SystemExit("the engine's outcomes differ from the torch path's (see above)")


if __name__ == "__main__":
    main()
