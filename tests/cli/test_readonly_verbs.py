"""The read-only verbs answer from the tracking store without importing the training or
cluster stacks (torch, Ray, plotly): a user waits for a database query, not for them. From
the embedded SQLite store they read without MLflow too (`service.tracking.sqlite_reader`:
importing MLflow and opening its store took ≈4 of their ≈4.5 CPU seconds), and say exactly
what they say when MLflow reads the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "plotly", "optuna")
# MLflow's store and what it imports; numpy, which only `run` needs (for its progress line)
NOT_NEEDED = ("mlflow", "sqlalchemy", "alembic", "pandas", "numpy")

PROBE = """
import json, sys
sys.argv = ["nalu-sweep", *json.loads(sys.argv[1])]
from service.cli import app
try:
    app(prog_name="nalu-sweep")
except SystemExit as e:
    code = e.code
else:
    code = 0
print("MODULES=" + json.dumps(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)
"""




def _loaded(args: list[str], cwd: Path) -> tuple[set[str], str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], cwd=cwd, env=env,
                          check=False, capture_output=True, text=True, timeout=300)
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES="))), proc.stdout + proc.stderr


@pytest.mark.parametrize("args", [["status"], ["best", "bench"],
                                  ["compare", "bench", "other"]],
                         ids=lambda a: " ".join(a))
def test_read_only_verbs_import_neither_torch_ray_nor_mlflow_nor_numpy(bench_store, args):
    modules, output = _loaded(args, bench_store)
    assert "trial-t0000" in output or "bench " in output, output  # it did read the store
    assert not modules & set(HEAVY), (sorted(modules & set(HEAVY)), output)
    assert not modules & set(NOT_NEEDED), (sorted(modules & set(NOT_NEEDED)), output)
    assert "Downloading artifacts" not in output and "Traceback" not in output, output


@pytest.mark.parametrize("args", [["status"], ["status", "bench"], ["best", "bench"],
                                  ["best", "bench", "--include-pruned", "--top", "3"],
                                  ["compare", "bench", "other"], ["status", "bnech"]],
                         ids=lambda a: " ".join(a))
def test_read_only_verbs_say_the_same_when_mlflow_reads_the_store(bench_store, monkeypatch, args):
    """With no schema the SQLite reader knows, the verbs fall back to MLflow's client."""
    from typer.testing import CliRunner

    from service.cli import app
    from service.tracking import sqlite_reader
    from service.tracking.store import default_tracking_uri

    monkeypatch.chdir(bench_store)
    runner = CliRunner()
    fast = runner.invoke(app, args)
    monkeypatch.setattr(sqlite_reader, "KNOWN_SCHEMAS", frozenset())
    assert sqlite_reader.open_reader(default_tracking_uri(bench_store)) is None
    slow = runner.invoke(app, args)
    assert (fast.exit_code, fast.output) == (slow.exit_code, slow.output)
    assert fast.exit_code == (2 if "bnech" in args else 0), fast.output
