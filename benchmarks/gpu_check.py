"""Everything that needs a GPU, in one call: tests, throughput, packed sweeps, recurrent tasks.

On a machine with an NVIDIA GPU and the project's dependencies importable, from the
repository's root:

    python benchmarks/gpu_check.py                  # every part, at most --budget seconds
    python benchmarks/gpu_check.py --parts cuda_tests,throughput
    python benchmarks/gpu_check.py --list           # the parts and their commands

Each part is a command of its own, run in a fresh process with a time limit (a part past its
limit is killed, with everything it started, and reported as "timeout"), one after the other
in the order of PARTS. After each part, the results so far are written to
benchmarks/results/gpu_check.json (and, when the environment variable OUT names a folder,
to OUT/gpu_check.json, with the whole output in OUT/gpu_check.log): the machine (GPU name,
driver, torch, CUDA and triton versions, the commit), and per part its command, wall time,
status and figures. A part whose files are not in this checkout is "skipped: absent"; one
that would start with less than MIN_PART_S of the budget left is "skipped: budget".

`python benchmarks/gpu_results.py` renders the JSON as markdown tables.

The commit is read from $NALU_SWEEP_COMMIT, else benchmarks/results/COMMIT, else `git
rev-parse HEAD`, else "unknown" (a copy of the tree without .git).

`--device cpu` runs the same parts on the CPU at tiny sizes (a smoke test of this script, no
figures worth keeping); `--dry-run` runs nothing and writes what would run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_JSON = RESULTS / "gpu_check.json"
SCHEMA = 1
MIN_PART_S = 20.0  # a part is not started with less of the budget left
TAIL_LINES = 12  # the last lines of a part's output kept in the JSON
# Python code run in a subprocess: what the machine is (CUDA is not initialised in this process,
# so that no part shares the GPU with it).
PROBE = r"""
import json, platform, sys
out = {"python": platform.python_version(), "platform": platform.platform()}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out["gpu"] = p.name
        out["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
        out["gpu_count"] = torch.cuda.device_count()
        out["multiprocessors"] = p.multi_processor_count
except Exception as e:  # noqa: BLE001 - recorded, not raised
    out["torch_error"] = repr(e)
try:
    import triton
    out["triton"] = triton.__version__
except Exception:
    out["triton"] = None
for name in ("ray", "optuna", "mlflow", "pydantic"):
    try:
        out[name] = __import__(name).__version__
    except Exception as e:  # noqa: BLE001
        out[name] = None
        out[name + "_error"] = repr(e)[:300]
print(json.dumps(out))
"""


@dataclass
class Part:
    """One time-boxed command. `build` returns the command (a list) given the run's settings
    and a scratch folder, or a string: the reason it is skipped. `figures` reads the output
    (stdout and stderr together) and the scratch folder into a dict."""

    name: str
    about: str
    timeout_s: float
    build: Callable[["Settings", Path], list[str] | str]
    figures: Callable[[str, Path], dict] = lambda out, scratch: {}


@dataclass
class Settings:
    device: str = "cuda"
    quick: bool = False  # tiny sizes (the CPU smoke test)
    python: str = sys.executable


# -- helpers ---------------------------------------------------------------------------------------------------
def child_env() -> dict[str, str]:
    """The parts' environment: this checkout first on PYTHONPATH (Ray's workers import
    `service` from it), then what PYTHONPATH already held (e.g. the carried packages)."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in paths if p != str(ROOT)]])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    return env


def commit() -> str:
    if os.environ.get("NALU_SWEEP_COMMIT"):
        return os.environ["NALU_SWEEP_COMMIT"].strip()
    path = RESULTS / "COMMIT"
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown"


def machine(python: str) -> dict:
    info: dict = {"cpus": os.cpu_count(), "commit": commit()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if smi.returncode == 0 and smi.stdout.strip():
            name, driver, memory = [s.strip() for s in smi.stdout.strip().splitlines()[0].split(",")]
            info |= {"nvidia_smi_gpu": name, "driver": driver, "nvidia_smi_memory": memory}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        info["nvidia_smi"] = None
    try:
        probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=120, env=child_env())
        info |= json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else {
            "probe_error": probe.stderr[-1000:]}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        info["probe_error"] = repr(e)
    return info


def run_part(part: Part, settings: Settings, timeout_s: float, log) -> dict:
    """Run one part in a process group of its own, killed as a whole past `timeout_s`."""
    record: dict = {"name": part.name, "about": part.about, "timeout_s": round(timeout_s)}
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{part.name}-") as tmp:
        scratch = Path(tmp)
        try:
            built = part.build(settings, scratch)
        except Exception as e:  # noqa: BLE001 - one part that cannot start does not stop the others
            record["status"] = f"error: could not build the command: {e!r}"
            return record
        if isinstance(built, str):
            record["status"] = f"skipped: {built}"
            return record
        record["command"] = shlex.join(built)
        log(f"\n=== {part.name}: {record['command']} (limit {timeout_s:.0f} s)\n")
        started = time.perf_counter()
        # output to a file, not a pipe: a process the part leaves behind holding the pipe open
        # would otherwise keep the part "running" until its limit
        with open(scratch / "output.log", "w") as output:
            proc = subprocess.Popen(built, cwd=ROOT, env=child_env(), stdout=output, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
                record["status"] = "passed" if proc.returncode == 0 else "failed"
            except subprocess.TimeoutExpired:
                stop_group(proc)
                record["status"] = "timeout"
        try:  # whatever it left running (a Ray worker holding GPU memory) does not reach the next part
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out = (scratch / "output.log").read_text(errors="replace")
        record["returncode"] = proc.returncode
        record["wall_s"] = round(time.perf_counter() - started, 1)
        log(out)
        try:
            record["figures"] = part.figures(out, scratch)
        except Exception as e:  # noqa: BLE001 - a part's output we cannot read is recorded as such
            record["figures"] = {"error": f"could not read the output: {e!r}"}
        # the last lines, as a list: one row in docs/gen_results.py's tables (the log has all)
        record["tail"] = [line[-200:] for line in out.rstrip().splitlines()[-TAIL_LINES:]]
    return record


def stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# -- pytest parts ----------------------------------------------------------------------------------------------
def pytest_command(settings: Settings, scratch: Path, files: list[str]) -> list[str]:
    return [settings.python, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
            f"--junitxml={scratch / 'junit.xml'}", *files]


def junit(out: str, scratch: Path) -> dict:
    """passed/failed/errors/skipped counts and the names of the failures, from junit.xml."""
    path = scratch / "junit.xml"
    if not path.exists():  # stopped at its limit: what the progress line had shown by then
        marks = "".join(re.findall(r"^([.sFExX]+)(?:\s+\[\s*\d+%\])?\s*$", out, re.M))
        return {"passed": marks.count("."), "failed": marks.count("F"), "errors": marks.count("E"),
                "skipped": marks.count("s"), "failures": [], "incomplete": "pytest wrote no report: counts "
                "from its progress line"}
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures, skips = [], []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = [child.tag for child in case]
        if "failure" in kinds:
            counts["failed"] += 1
            failures.append(name)
        elif "error" in kinds:
            counts["errors"] += 1
            failures.append(name)
        elif "skipped" in kinds:
            counts["skipped"] += 1
            skip = case.find("skipped")
            skips.append(f"{name}: {(skip.get('message') or '')[:120]}")
        else:
            counts["passed"] += 1
    seconds = re.findall(r" in ([\d.]+)s", out)
    return counts | {"failures": failures, "skips": skips[:20]} | ({"pytest_s": float(seconds[-1])} if seconds else {})


def existing(patterns: list[str], exclude: tuple[str, ...] = ()) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        for path in sorted(ROOT.glob(pattern)):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in found and path.name not in exclude:
                found.append(rel)
    return found


def cuda_tests(settings: Settings, scratch: Path) -> list[str] | str:
    files = existing(["tests/training/test_cuda.py", "tests/sweep/test_gpu_sweep.py", "tests/**/test_cuda*.py"],
                     exclude=("test_cuda_capture.py",))
    return pytest_command(settings, scratch, files) if files else "absent (tests/training/test_cuda.py, ...)"


def capture_tests(settings: Settings, scratch: Path) -> list[str] | str:
    files = existing(["tests/training/test_cuda_capture.py"])
    return pytest_command(settings, scratch, files) if files else "absent (tests/training/test_cuda_capture.py)"


def engine_tests(settings: Settings, scratch: Path) -> list[str] | str:
    return pytest_command(settings, scratch, ["tests/engine"]) if (ROOT / "tests/engine").is_dir() else \
        "absent (tests/engine/)"


# -- benchmark parts -------------------------------------------------------------------------------------------
def script_has(script: str, option: str) -> bool:
    path = ROOT / script
    return path.is_file() and f'"{option}"' in path.read_text()


def throughput(settings: Settings, scratch: Path) -> list[str] | str:
    if not (ROOT / "benchmarks/throughput.py").is_file():
        return "absent (benchmarks/throughput.py)"
    seeds, seconds = ("10,100", "0.5") if settings.quick else ("100,1000,10000", "3")
    return [settings.python, "benchmarks/throughput.py", "--device", settings.device, "--threads", "1",
            "--seconds", seconds, "--seeds", seeds] + (["--compile", "off"] if settings.quick else [])


def throughput_figures(out: str, scratch: Path) -> dict:
    """The table rows `S  seed·steps/s  × reference  set-up s  5e6 steps` and the reference."""
    rows = {}
    for s, rate, ratio, setup in re.findall(r"^\s*(\d+)\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\s+[\d,.]+ min", out, re.M):
        rows[s] = {"seed_steps_per_s": int(rate.replace(",", "")), "x_reference": float(ratio),
                   "setup_s": float(setup)}
    ref = re.search(r"reference one-seed loop: ([\d,]+) steps/s", out)
    return {"by_seeds": rows} | ({"reference_steps_per_s": int(ref.group(1).replace(",", ""))} if ref else {})


def sweep_trainer(settings: Settings, scratch: Path) -> list[str] | str:
    if not (ROOT / "benchmarks/sweep_throughput.py").is_file():
        return "absent (benchmarks/sweep_throughput.py)"
    # the configuration (evaluation every 2,000 steps, the script's default): 32 trials
    # packed 8 at a time against one after another, on the device engine as a GPU sweep trains
    seeds, steps, packs, trials = ("4", "300", "2", "4") if settings.quick else ("16", "20000", "8", "32")
    engine = ["--engine"] if script_has("benchmarks/sweep_throughput.py", "--engine") else []
    return [settings.python, "benchmarks/sweep_throughput.py", "--level", "trainer", "--device", settings.device,
            "--seeds", seeds, "--steps", steps, "--packs", packs, "--trials", trials, *engine,
            "--json", str(scratch / "rows.json")]


def json_rows(out: str, scratch: Path) -> dict:
    path = scratch / "rows.json"
    return {"rows": json.loads(path.read_text())["rows"]} if path.exists() else {}


# A real `nalu-sweep sweep` (Ray + Optuna + MLflow) on a tiny search space, run as the CLI is.
SWEEP_TASK = {"kind": "arithmetic", "operation": "mul"}
SWEEP_PARAMS = {"lr": {"type": "loguniform", "low": 1e-3, "high": 3e-2, "target": "train.optimizer.lr"},
                "lambda_max": {"type": "loguniform", "low": 0.1, "high": 10.0,
                               "target": "train.regularizer.lambda_max"}}
# After the sweep: its trials' outcomes and devices, from the MLflow store it wrote.
SWEEP_READ = r"""
import json, sys
from service.tracking import runs, store
client = store.client(sys.argv[1])
experiment = client.get_experiment_by_name(sys.argv[2])
parent = runs.find_sweep_run(client, experiment.experiment_id, sys.argv[2])
trials = runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)
print("SWEEP_READ " + json.dumps({
    "trials": len(trials),
    "outcomes": sorted(t.data.tags.get(store.TAG_OUTCOME, "?") for t in trials),
    "devices": sorted({t.data.tags.get(store.TAG_DEVICE, "?") for t in trials}),
    "gpu_ids": sorted({t.data.tags.get(store.TAG_GPU_IDS, "?") for t in trials}),
}))
"""


def sweep_space(settings: Settings, name: str, trials: int, pack: int, gpus: float, concurrency: int) -> dict:
    seeds, steps = (2, 200) if settings.quick else (16, 5000)
    return {"name": name, "task": SWEEP_TASK,
            "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": settings.device,
                      "compile": "off" if settings.quick else "auto",
                      "train": {"batch_size": 128, "optimizer": {"name": "adam"},
                                "regularizer": {"lambda_max": 1.0, "t_start": steps // 5, "t_end": 2 * steps // 5}}},
            "params": SWEEP_PARAMS, "seeds": seeds, "steps": steps, "eval_every": steps // 5, "trials": trials,
            "concurrency": concurrency, "pack": pack, "checkpoint_every": 0, "retries": 0,
            "scheduler": {"type": "none"}, "sampler": {"type": "random", "seed": 0},
            "resources": {"cpus": 1, "gpus": gpus if settings.device == "cuda" else 0}}


def sweep_part(name: str, trials: int, pack: int, gpus: float, concurrency: int):
    def build(settings: Settings, scratch: Path) -> list[str] | str:
        if not (ROOT / "service" / "__main__.py").is_file():
            return "absent (service/__main__.py)"
        import yaml  # only when a sweep part runs: --dry-run and --list need no yaml

        space = sweep_space(settings, name, trials, pack, gpus, concurrency)
        (scratch / "space.yaml").write_text(yaml.safe_dump(space))
        uri = f"sqlite:///{scratch}/mlflow.db"
        # the sweep, then (if it succeeded) what it recorded; one command, so one time limit
        sweep = [settings.python, "-m", "service", "sweep", str(scratch / "space.yaml"), "--tracking-uri", uri,
                 "--storage-path", str(scratch / "runs")]
        read = [settings.python, "-c", SWEEP_READ, uri, name]
        seed_steps = trials * space["seeds"] * space["steps"]
        script = (f"s=$(date +%s%N); {shlex.join(sweep)} || exit $?; e=$(date +%s%N); "
                  f"echo SWEEP_NS $s $e SEED_STEPS {seed_steps}; {shlex.join(read)}")
        return ["bash", "-c", script]

    return build


def sweep_figures(out: str, scratch: Path) -> dict:
    figures: dict = {}
    wall = re.search(r"^SWEEP_NS (\d+) (\d+) SEED_STEPS (\d+)", out, re.M)
    if wall:
        seconds, seed_steps = (int(wall.group(2)) - int(wall.group(1))) / 1e9, int(wall.group(3))
        figures |= {"sweep_wall_s": round(seconds, 1), "seed_steps": seed_steps,
                    "seed_steps_per_s": round(seed_steps / seconds)}
    read = re.search(r"^SWEEP_READ (.*)$", out, re.M)
    if read:
        figures |= json.loads(read.group(1))
    return figures


def recurrent_runs(settings: Settings, scratch: Path) -> list[str] | str:
    """The issue's two recurrent CLI runs, one after the other."""
    if not (ROOT / "service" / "__main__.py").is_file():
        return "absent (service/__main__.py)"
    steps = "50" if settings.quick else "2000"
    runs = [["--task", "sequential_digits", "--operation", "sum", "--seeds", "8"],
            ["--task", "sequence_arithmetic", "--operation", "sum", "--units", "nau,lstm", "--seeds", "16"]]
    cmds = [[settings.python, "-m", "service", "run", *r, "--steps", steps, "--device", settings.device, "--quiet",
             "--output", str(scratch / f"run{i}.json")] for i, r in enumerate(runs)]
    return ["bash", "-c", " && ".join(shlex.join(c) for c in cmds)]


def recurrent_figures(out: str, scratch: Path) -> dict:
    figures = {}
    for path in sorted(scratch.glob("run*.json")):
        data = json.loads(path.read_text())
        cfg = data["config"]
        seeds, steps = cfg["seeds"], cfg["train"]["steps"]
        key = cfg["task"]["kind"]  # the two runs are of two tasks
        figures[key] = {"seeds": seeds, "steps": steps, "elapsed_s": round(data["elapsed_s"], 2),
                        "device": data.get("device"), "compiled": data.get("compiled"),
                        "seed_steps_per_s": round(seeds * steps / data["elapsed_s"])}
    return figures


def recurrent_throughput(settings: Settings, scratch: Path) -> list[str] | str:
    """Both recurrent tasks: on a GPU whole runs of 2,000 steps, cold (compiling) and warm."""
    script = "benchmarks/recurrent_throughput.py"
    if not (ROOT / script).is_file():
        return f"absent ({script})"
    if settings.device != "cpu" and not script_has(script, "--device"):
        return f"{script} has no --device option: it measures the CPU only"
    cmds = []
    for task in ("sequence_arithmetic", "sequential_digits"):
        cmd = [settings.python, script, "--task", task, "--seconds", "0.5" if settings.quick else "2",
               "--seeds", "1,10" if settings.quick else "16"]
        if script_has(script, "--device"):
            cmd += ["--device", settings.device]
        if script_has(script, "--json"):
            cmd += ["--json", str(scratch / f"recurrent-{task}.json")]
        cmds.append(shlex.join(cmd))
    return ["bash", "-c", " && ".join(cmds)]


def recurrent_throughput_figures(out: str, scratch: Path) -> dict:
    return {path.stem.removeprefix("recurrent-"): json.loads(path.read_text())["rows"]
            for path in sorted(scratch.glob("recurrent-*.json"))}


def engine_throughput(settings: Settings, scratch: Path) -> list[str] | str:
    script = "benchmarks/engine_throughput.py"
    if not (ROOT / script).is_file():
        return f"absent ({script})"
    cmd = [settings.python, script]
    if script_has(script, "--device"):
        cmd += ["--device", settings.device]
    if script_has(script, "--json"):
        cmd += ["--json", str(scratch / "engine.json")]
    if settings.quick and script_has(script, "--quick"):
        cmd += ["--quick"]
    elif settings.device == "cuda" and script_has(script, "--seeds"):  # the three sizes, both paths
        cmd += ["--seeds", "100,1000,10000", "--seconds", "2"]
    return cmd


def engine_figures(out: str, scratch: Path) -> dict:
    path = scratch / "engine.json"
    return {"json": json.loads(path.read_text())} if path.exists() else {}


def engine_outcomes(settings: Settings, scratch: Path) -> list[str] | str:
    """The engine's `small_mul` outcomes, 100 seeds per covered model at the protocol's
    200,000 steps, against the torch path's committed ones (CPU, the same initial weights and
    batches): NMU the same outcome for >= 95 seeds, every rate inside the torch interval."""
    script, reference = "benchmarks/engine_throughput.py", "benchmarks/reproduce_small_mul.json"
    if not (ROOT / script).is_file() or "def torch_reference" not in (ROOT / script).read_text():
        return f"absent ({script} reading a reproduce.py result)"
    cmd = [settings.python, script, "outcomes", "--device", settings.device, "--task", "small_mul",
           "--json", str(scratch / "outcomes.json")]
    if settings.quick:
        return cmd + ["--seeds", "2", "--steps", "20", "--models", "NMU", "--paths", "engine,torch"]
    return cmd + ["--seeds", "100", "--steps", "200000", "--models", "NMU,NAC•,Linear", "--paths", "engine",
                  "--torch-json", str(ROOT / reference)]


def outcome_figures(out: str, scratch: Path) -> dict:
    path = scratch / "outcomes.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {name: (f"{c['same_outcome']}/{c['of']} seeds the same outcome, engine rate "
                   f"{'inside' if c['engine_rate_inside_torch_ci'] else 'OUTSIDE'} the torch interval: "
                   f"{'ok' if c['ok'] else 'FAIL'}") for name, c in data.get("checks", {}).items()}


TABLE1_SEED_STEPS = 7 * 4 * 100 * 5_000_000  # the NAU paper's Table 1: models × operations × seeds × steps


def table1_rate(settings: Settings, scratch: Path) -> list[str] | str:
    """The arithmetic protocol shortened: every model, its four operations as one seed batch,
    the seven models side by side (one process each), the engine where it covers a model."""
    script = "benchmarks/reproduce.py"
    if not (ROOT / script).is_file() or not script_has(script, "--cell-by-cell"):
        return f"absent ({script} with its operations as one seed batch)"
    cmd = [settings.python, script, "arithmetic", "--device", settings.device, "--out", str(scratch / "table1"),
           "--checkpoint-every", "0"]
    if settings.quick:
        return cmd + ["--seeds", "2", "--steps", "200", "--models", "NMU"]
    return cmd + ["--engine", "--seeds", "100", "--steps", "20000", "--jobs", "7"]


def table1_figures(out: str, scratch: Path) -> dict:
    path = scratch / "table1" / "arithmetic.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    ok = [c for c in data["cells"] if c["status"] == "ok"]
    seed_steps = len(ok) * data["seeds"] * data["steps"]
    rate = seed_steps / data["elapsed_s"] if data["elapsed_s"] > 0 else None
    return {"seeds": data["seeds"], "steps": data["steps"], "cells": len(ok), "elapsed_s": data["elapsed_s"],
            "seed_steps_per_s": rate, "engine_cells": sum(bool(c.get("engine")) for c in ok),
            "table1_projected_s": TABLE1_SEED_STEPS / rate if rate else None,
            "success": {f"{c['row']['op']} {c['row']['model']}": c["aggregate"]["successes"] for c in ok}}


# In priority order: when the budget runs short, the last ones are skipped.
PARTS: list[Part] = [
    Part("cuda_tests", "the CUDA tests (tests/training/test_cuda.py, tests/sweep/test_gpu_sweep.py, "
         "tests/**/test_cuda*.py)", 420, cuda_tests, junit),
    Part("capture", "the CUDA-graph capture stress test (tests/training/test_cuda_capture.py)", 80,
         capture_tests, junit),
    Part("throughput", "benchmarks/throughput.py at S = 100, 1,000, 10,000 (set-up included)", 110,
         throughput, throughput_figures),
    Part("sweep_trainer", "benchmarks/sweep_throughput.py --level trainer --engine: 32 trials × 16 seeds × 20,000 "
         "steps packed 8 at a time against one after another, and the next pack of 7 (set-up included)", 200,
         sweep_trainer, json_rows),
    Part("sweep_pack8", "a real `nalu-sweep sweep`, 8 trials × 16 seeds × 5,000 steps, pack: 8 (one pack on the "
         "GPU)", 120, sweep_part("gpu-check-pack8", 8, 8, 1.0, 1), sweep_figures),
    Part("sweep_quarter_gpu", "a real `nalu-sweep sweep`, 8 trials × 16 seeds × 5,000 steps, unpacked, gpus: "
         "0.25 (four at once)", 120, sweep_part("gpu-check-quarter", 8, 1, 0.25, 4), sweep_figures),
    Part("recurrent_run", "`nalu-sweep run` of sequential_digits (8 seeds) and sequence_arithmetic with "
         "nau,lstm (16 seeds), 2,000 steps each", 90, recurrent_runs, recurrent_figures),
    Part("engine_tests", "the device engine's tests (tests/engine/; each new kernel configuration JIT-compiles, ~5 s)", 300,
         engine_tests, junit),
    Part("engine_throughput", "benchmarks/engine_throughput.py rate: NAU → NMU at S = 100, 1,000, 10,000, engine and torch path", 150, engine_throughput, engine_figures),
    Part("engine_outcomes", "benchmarks/engine_throughput.py outcomes: small_mul, 100 seeds × 200,000 steps of "
         "NMU, NAC• and Linear on the engine against the torch path's committed outcomes "
         "(benchmarks/reproduce_small_mul.json)", 150, engine_outcomes, outcome_figures),
    Part("table1_rate", "benchmarks/reproduce.py arithmetic --engine, 100 seeds × 20,000 steps: each model's four "
         "operations as one seed batch, the seven models side by side (--jobs 7); the projection to Table 1",
         240, table1_rate, table1_figures),
    Part("recurrent_throughput", "benchmarks/recurrent_throughput.py, both recurrent tasks, 16 seeds (on a GPU: "
         "whole runs of 2,000 steps, cold and warm)", 90,
         recurrent_throughput, recurrent_throughput_figures),
]


def select(names: str | None) -> list[Part]:
    if not names:
        return list(PARTS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {p.name: p for p in PARTS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"gpu_check: unknown part(s) {', '.join(unknown)}; the parts are: {', '.join(known)}")
    return [known[n] for n in wanted]


def run_all(parts: list[Part], settings: Settings, budget: float, report: dict, save: Callable[[], None], log,
            dry_run: bool = False, min_part_s: float = MIN_PART_S) -> None:
    """Run `parts` in order within `budget` seconds, appending each record to report["parts"]
    and calling `save` after each."""
    started = time.perf_counter()
    for part in parts:
        left = budget - (time.perf_counter() - started)
        if dry_run:
            with tempfile.TemporaryDirectory() as tmp:
                built = part.build(settings, Path(tmp))
            record = {"name": part.name, "about": part.about, "timeout_s": part.timeout_s,
                      "status": f"skipped: {built}" if isinstance(built, str) else "dry-run"}
            if not isinstance(built, str):
                record["command"] = shlex.join(built)
        elif left < min_part_s:
            record = {"name": part.name, "about": part.about, "status": "skipped: budget"}
        else:
            record = run_part(part, settings, min(part.timeout_s, left), log)
        report["parts"].append(record)
        report["wall_s"] = round(time.perf_counter() - started, 1)
        save()
        log(f"--- {part.name}: {record['status']}"
            + (f" in {record['wall_s']} s" if "wall_s" in record else "")
            + (f" {json.dumps(record['figures'])[:600]}" if record.get("figures") else "") + "\n")


def write(report: dict, paths: list[Path]) -> None:
    text = json.dumps(report, indent=1) + "\n"
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", help=f"comma-separated, of: {', '.join(x.name for x in PARTS)} (default: all)")
    p.add_argument("--budget", type=float, default=450.0, help="seconds for all parts together (default 450)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: a smoke test of this script at tiny sizes (default cuda)")
    p.add_argument("--dry-run", action="store_true", help="run nothing; write what would run")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="default benchmarks/results/gpu_check.json")
    p.add_argument("--list", action="store_true", help="print the parts and stop")
    a = p.parse_args(argv)
    if a.budget <= 0:
        raise SystemExit("gpu_check: --budget must be positive")
    parts = select(a.parts)
    settings = Settings(device=a.device, quick=a.device == "cpu")
    if a.list:
        for part in parts:
            print(f"{part.name:22} {part.timeout_s:>4.0f} s  {part.about}")
        return 0
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    paths = [a.json] + ([out_dir / "gpu_check.json"] if out_dir else [])
    log_file = open(out_dir / "gpu_check.log", "a") if out_dir else None  # noqa: SIM115 - closed below

    def log(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        if log_file:
            log_file.write(text)
            log_file.flush()

    started = time.perf_counter()
    report = {"schema": SCHEMA, "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "device": a.device, "budget_s": a.budget, "dry_run": a.dry_run,
              "command": shlex.join(["python", "benchmarks/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]),
              "machine": {}, "parts": []}
    report["machine"] = {"commit": commit()} if a.dry_run else machine(settings.python)
    log(f"gpu_check: {json.dumps(report['machine'])}\n")
    write(report, paths)
    run_all(parts, settings, a.budget - (time.perf_counter() - started), report, lambda: write(report, paths), log,
            dry_run=a.dry_run)
    report["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    report["wall_s"] = round(time.perf_counter() - started, 1)
    write(report, paths)
    bad = [r["name"] for r in report["parts"]
           if r["status"] in ("failed", "timeout") or r["status"].startswith("error")]
    log(f"gpu_check: {len(report['parts'])} parts in {report['wall_s']} s; "
        + (f"failed or timed out: {', '.join(bad)}" if bad else "none failed") + f"; {paths[0]}\n")
    if log_file:
        log_file.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
