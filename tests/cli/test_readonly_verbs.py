"""The read-only verbs answer from the tracking store without importing the training or
cluster stacks (torch, Ray, plotly): a user waits for a database query, not for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "plotly", "optuna")

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
                          capture_output=True, text=True, timeout=300)
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES="))), proc.stdout + proc.stderr


@pytest.mark.parametrize("args", [["status"], ["best", "bench"],
                                  ["compare", "bench", "other"]],
                         ids=lambda a: " ".join(a))
def test_read_only_verbs_do_not_import_torch_or_ray(bench_store, args):
    modules, output = _loaded(args, bench_store)
    assert "mlflow" in modules, output  # it did read the store
    assert not modules & set(HEAVY), (sorted(modules & set(HEAVY)), output)
    assert "Downloading artifacts" not in output and "Traceback" not in output, output
