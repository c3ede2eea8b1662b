"""How many seeds `nalu-sweep run` trains in the time the reference implementation trains
one, whole processes on one CPU thread (start-up, data, training and evaluation included).

    python benchmarks/seeds_per_reference.py --reference DIR --reference-python PY
                                             [--pairs 3] [--cpu 1] [--seeds 100] [--steps 30000]

The reference is the NAU/NMU paper's own code, AndreasMadsen/stable-nalu, fetched into a
scratch directory (never into this repository) with an environment of its own:

    git clone https://github.com/AndreasMadsen/stable-nalu /tmp/stable-nalu
    python -m venv /tmp/stable-nalu-env
    /tmp/stable-nalu-env/bin/pip install torch numpy scipy tqdm pandas tensorboardX tensorflow-cpu

(its setup.py's dependencies; its package imports TensorFlow for its log reader, and
torchvision, which it does not use here: with a CPU torch that no torchvision release on
PyPI matches, ``pip install --no-deps torchvision==0.15.2 pillow`` imports with a warning).
With today's tensorboardX the reference's last statement, ``torch.save`` of its model
(which holds its log writer), fails after training and evaluation have ended; the
benchmark counts a reference run as done once it printed ``finished:``. The two
commands, the same problem (NAU → NMU on the 100-input mul task, batch 128, evaluation
every 1,000 steps on 10,000 + 10,000 samples):

* ours: ``nalu-sweep run --task arithmetic --operation mul --units nau,nmu --seeds S --steps N``
* the reference, one seed: ``experiments/simple_function_static.py --layer-type
  ReRegualizedLinearNAC --nac-mul mnac --operation mul --max-iterations N --no-cuda``

Both run pinned to one CPU (``taskset -c CPU``) with one thread (``OMP_NUM_THREADS=1``;
the reference's own ``LSB_DJOB_NUMPROC=1``), in scratch directories; one warm-up of each
(not counted), then ``--pairs`` pairs, alternated, wall time of each whole process. The
figure is S × (reference seconds) / (our seconds), per pair and for the medians; it is
printed and written to ``benchmarks/results/seeds_per_reference.json`` (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "seeds_per_reference.json"
SCRIPT = Path("experiments") / "simple_function_static.py"
REFERENCE_TRAINED = "finished:"  # the reference prints it after its last step and evaluation


def ours_command(seeds: int, steps: int) -> list[str]:
    return [sys.executable, "-m", "service", "run", "--task", "arithmetic", "--operation", "mul",
            "--units", "nau,nmu", "--seeds", str(seeds), "--steps", str(steps)]


def reference_command(python: str, reference: Path, steps: int) -> list[str]:
    return [python, str(reference / SCRIPT), "--layer-type", "ReRegualizedLinearNAC", "--nac-mul", "mnac",
            "--operation", "mul", "--max-iterations", str(steps), "--no-cuda", "--seed", "0"]


def timed(cmd: list[str], cpu: int | None, env: dict[str, str], cwd: Path, trained: str | None = None) -> float:
    """Wall seconds of ``cmd`` as one whole process (pinned to ``cpu`` when given). With
    ``trained``, a process that printed that line at the start of a line has trained and
    evaluated everything, whatever its exit code (the reference's last statement, below)."""
    full = (["taskset", "-c", str(cpu)] if cpu is not None else []) + cmd
    start = time.perf_counter()
    done = subprocess.run(full, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    finished = trained is not None and any(line.startswith(trained) for line in done.stdout.splitlines())
    if done.returncode != 0 and not finished:
        raise SystemExit(f"{' '.join(cmd[:4])} … failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
    return seconds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True, help="a checkout of AndreasMadsen/stable-nalu")
    parser.add_argument("--reference-python", default=sys.executable,
                        help="the Python of the reference's environment (default: this one)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=1, help="the CPU both are pinned to (-1: not pinned)")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if not (args.reference / SCRIPT).is_file():
        parser.error(f"{args.reference / SCRIPT} does not exist: clone AndreasMadsen/stable-nalu there (see --help)")
    if args.pairs < 1 or args.seeds < 1 or args.steps < 1:
        parser.error("--pairs, --seeds and --steps must be at least 1")
    cpu = None if args.cpu < 0 else args.cpu
    if cpu is not None and shutil.which("taskset") is None:
        parser.error("taskset is not installed (util-linux); pass --cpu -1 to run unpinned")

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LSB_DJOB_NUMPROC": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    ours, theirs = [], []
    with tempfile.TemporaryDirectory(prefix="seeds-per-reference-") as tmp:
        scratch = Path(tmp)
        ref_env = {**env, "TENSORBOARD_DIR": str(scratch / "tensorboard"), "SAVE_DIR": str(scratch / "save"),
                   "PYTHONPATH": os.pathsep.join([str(args.reference), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        our_cmd = ours_command(args.seeds, args.steps)
        ref_cmd = reference_command(args.reference_python, args.reference, args.steps)
        print("warm-up (not counted) …", flush=True)
        timed(our_cmd, cpu, env, scratch)
        timed(ref_cmd, cpu, ref_env, args.reference, REFERENCE_TRAINED)
        for pair in range(args.pairs):
            ours.append(timed(our_cmd, cpu, env, scratch))
            theirs.append(timed(ref_cmd, cpu, ref_env, args.reference, REFERENCE_TRAINED))
            print(f"pair {pair + 1}: ours {ours[-1]:.1f} s for {args.seeds} seeds, reference {theirs[-1]:.1f} s "
                  f"for one: {args.seeds * theirs[-1] / ours[-1]:.0f} seeds per reference seed", flush=True)
    ratios = [args.seeds * r / o for o, r in zip(ours, theirs)]
    figures = {
        "command": f"python benchmarks/seeds_per_reference.py --reference DIR --reference-python PY "
                   f"--pairs {args.pairs} --seeds {args.seeds} --steps {args.steps}",
        "cpu": "not pinned" if cpu is None else f"pinned to CPU {cpu}", "threads": 1,
        "seeds": args.seeds, "steps": args.steps, "pairs": args.pairs,
        "ours_s": {"median": round(statistics.median(ours), 1), "min": round(min(ours), 1), "max": round(max(ours), 1)},
        "reference_s": {"median": round(statistics.median(theirs), 1), "min": round(min(theirs), 1),
                        "max": round(max(theirs), 1)},
        "seeds_per_reference_seed": round(args.seeds * statistics.median(theirs) / statistics.median(ours), 1),
        "pair_ratios": [round(r, 1) for r in ratios],
    }
    print(f"ours: {figures['ours_s']['median']} s median for {args.seeds} seeds; reference: "
          f"{figures['reference_s']['median']} s median for one -> {figures['seeds_per_reference_seed']} seeds "
          f"per reference seed (pairs {min(ratios):.0f}-{max(ratios):.0f})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
