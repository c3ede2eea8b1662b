"""Render benchmarks/results/gpu_check.json (written by gpu_check.py) as markdown tables.

    python benchmarks/gpu_results.py [path/to/gpu_check.json] > table.md

One line on the machine (GPU, driver, torch, CUDA, commit), a table of the parts (status,
wall time, the main figure), then the throughput, packed-sweep and recurrent figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent / "results" / "gpu_check.json"


def _n(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else str(x)


def summary(part: dict) -> str:
    """The one figure a reader wants from each part."""
    f = part.get("figures") or {}
    if isinstance(f.get("json"), dict) and f["json"].get("kind") == "rate":  # engine_throughput.py rate
        return "; ".join(f"{r['path']} S = {_n(r['seeds'])}: {_n(r['seed_steps_per_s'])} seed·steps/s"
                         for r in f["json"]["rows"])
    if "table1_projected_s" in f:  # gpu_check's table1_rate
        projected = f["table1_projected_s"]
        return (f"{f['cells']} cells × {_n(f['seeds'])} seeds × {_n(f['steps'])} steps in {f['elapsed_s']:.0f} s: "
                f"{_n(f['seed_steps_per_s'])} seed·steps/s ({f['engine_cells']} cells on the engine); Table 1 "
                + (f"projected {projected / 60:.0f} min" if projected else "not projected"))
    if "passed" in f:
        text = f"{f['passed']} passed, {f['failed']} failed, {f['errors']} errors, {f['skipped']} skipped"
        return text + (f" ({', '.join(f['failures'][:3])})" if f.get("failures") else "")
    if "by_seeds" in f:
        return "; ".join(f"S = {_n(int(s))}: {_n(r['seed_steps_per_s'])} seed·steps/s"
                         for s, r in f["by_seeds"].items())
    if "rows" in f:
        return "; ".join(f"pack {r['pack']}: {r['packed_s']} s packed vs {r['one_by_one_s']} s one after another "
                         f"({r['ratio']}×)" for r in f["rows"])
    if "sweep_wall_s" in f:
        outcomes = ", ".join(f"{f['outcomes'].count(o)} {o}" for o in sorted(set(f.get("outcomes", []))))
        return (f"{f['sweep_wall_s']} s, {_n(f['seed_steps_per_s'])} seed·steps/s (set-up included)"
                + (f"; {f['trials']} trials ({outcomes}) on {', '.join(f['devices'])}" if "trials" in f else ""))
    if f and all(isinstance(v, dict) and "seed_steps_per_s" in v for v in f.values()):
        return "; ".join(f"{k}: {_n(v['seed_steps_per_s'])} seed·steps/s" for k, v in f.items())
    if f and all(isinstance(v, list) for v in f.values()):  # recurrent_throughput.py's rows per task
        return "; ".join(f"{task}: " + ", ".join(_recurrent_row(r) for r in rows) for task, rows in f.items())
    if f and all(isinstance(v, str) for v in f.values()):  # a call's findings, in words
        return "; ".join(f"{k}: {v}" for k, v in f.items())
    return ""


def _recurrent_row(r: dict) -> str:
    if "warm_seed_steps_per_s" in r:  # whole runs
        return (f"S={r['seeds']} {_n(r['warm_seed_steps_per_s'])} seed·steps/s warm "
                f"({_n(r['cold_seed_steps_per_s'])} cold) on {r.get('device', '?')}")
    return f"S={r['seeds']} {_n(r['seed_steps_per_s'])} seed·steps/s ({r.get('ratio', '?')}× one-seed loop)"


def render(report: dict) -> str:
    m = report.get("machine", {})
    gpu = m.get("gpu") or m.get("nvidia_smi_gpu") or "no GPU"
    lines = [f"Machine: {gpu}" + (f" ({m['gpu_memory_gib']} GiB)" if m.get("gpu_memory_gib") else "")
             + (f", driver {m['driver']}" if m.get("driver") else "")
             + f", torch {m.get('torch', '?')} (CUDA {m.get('torch_cuda') or '-'}), triton {m.get('triton') or '-'}, "
             f"Python {m.get('python', '?')}, commit {str(m.get('commit', 'unknown'))[:12]}; "
             f"run {report.get('started', '?')}, {report.get('wall_s', '?')} s"
             + (" (dry run)" if report.get("dry_run") else ""), "",
             "| part | status | wall s | figures |", "|---|---|---|---|"]
    for part in report.get("parts", []):
        status = part["status"] + (f" (commit {str(part['commit'])[:7]}, an earlier run)" if part.get("commit") else "")
        lines.append(f"| {part['name']} | {status} | {part.get('wall_s', '')} | {summary(part)} |")
    for part in report.get("parts", []):
        f = part.get("figures") or {}
        if part["name"] == "throughput" and f.get("by_seeds"):
            lines += ["", "| S | seed·steps/s | × one-seed loop | set-up s |", "|---|---|---|---|"]
            for s, r in f["by_seeds"].items():
                lines.append(f"| {_n(int(s))} | {_n(r['seed_steps_per_s'])} | {r['x_reference']} | {r['setup_s']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="?", type=Path, default=DEFAULT)
    a = p.parse_args()
    if not a.json.is_file():
        sys.exit(f"gpu_results: no {a.json}; run benchmarks/gpu_check.py on a GPU machine first")
    sys.stdout.write(render(json.loads(a.json.read_text())))


if __name__ == "__main__":
    main()
