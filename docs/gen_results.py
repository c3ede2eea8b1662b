"""The measured figures, as the benchmarks wrote them: one section per
`benchmarks/results/*.json`, its scalar values flattened into a table (``a.b.c``), with
the command that reproduces it when the file names one (a ``command`` key). Run by the
docs' hook (`docs/hooks.py`) at build time; `python docs/gen_results.py` prints it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
MAX_ROWS = 60


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [row for k, v in value.items() for row in _flatten(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            return [(prefix, ", ".join(map(str, value)))] if len(value) <= 12 else [(prefix, f"{len(value)} values")]
        return [row for i, v in enumerate(value) for row in _flatten(v, f"{prefix}[{i}]")]
    if isinstance(value, float):
        return [(prefix, f"{value:.4g}")]
    return [(prefix, str(value))]


def _gpu_tables(report: dict) -> str:
    """The GPU check's report as `benchmarks/gpu_results.py` renders it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_results", RESULTS.parent / "gpu_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.render(report)


def results_markdown(directory: Path = RESULTS) -> str:
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        return ("No benchmark has written its figures to `benchmarks/results/` in this checkout yet; "
                "each benchmark script under `benchmarks/` writes its own file there when run.")
    parts = []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            parts.append(f"### `{path.name}`\n\nunreadable: {e}\n")
            continue
        if path.name == "gpu_check.json" and isinstance(data, dict):  # its own tables (benchmarks/gpu_results.py)
            parts.append(f"### `{path.name}`\n\nReproduce on a GPU host with `python benchmarks/gpu_check.py` "
                         f"(this file: `{data.get('command', '')}`)\n\n{_gpu_tables(data)}")
            continue
        command = data.get("command") if isinstance(data, dict) else None
        rows = [(k, v) for k, v in _flatten(data) if k != "command"]
        text = [f"### `{path.name}`", ""]
        if command:
            text += ["Reproduce with:", "", "```bash", str(command), "```", ""]
        text += ["| figure | value |", "|---|---|"]
        text += [f"| `{k}` | {str(v).replace('|', '/')} |" for k, v in rows[:MAX_ROWS]]
        if len(rows) > MAX_ROWS:
            text.append(f"| … | {len(rows) - MAX_ROWS} more in the file |")
        parts.append("\n".join(text) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(results_markdown())
