"""`nalu-sweep run`: end to end with a tiny budget, and clear errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()
TINY = ["--steps", "30", "--eval-every", "10", "--seeds", "3", "--quiet"]


def test_run_writes_per_seed_json(tmp_path):
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["run", "--task", "arithmetic", "--operation", "add",
                                 "--units", "nau,nau", "--output", str(out), *TINY])
    assert result.exit_code == 0, result.output
    assert "success rate" in result.output
    data = json.loads(out.read_text())
    assert len(data["seeds"]) == 3
    assert {"success", "solved_at", "sparsity_error", "diverged", "extrapolation_mse"} <= set(data["seeds"][0])
    assert data["aggregate"]["n_seeds"] == 3


def test_run_from_yaml_with_flag_override(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("task: {kind: small_mul}\nmodel: {layers: [{unit: nau}, {unit: nmu}]}\n"
                   "train: {steps: 500, eval_every: 10}\nseeds: 5\n")
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["run", str(cfg), "--steps", "20", "--output", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["config"]["train"]["steps"] == 20
    assert len(data["seeds"]) == 5


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--units", "nau,nmux"], "unknown unit 'nmux'"),
        (["--interpolation", "U[2,1]"], "interpolation"),
        (["--operation", "div", "--interpolation", "U[-2,2]"], "div"),
        (["--operation", "mull"], "operation"),
        (["--init", "gaussian", "--units", "nau,nmu"], "unknown initialisation"),
        (["--seeds", "0"], "seeds"),
    ],
)
def test_bad_input_is_a_clear_error_without_traceback(args, expected):
    result = runner.invoke(app, ["run", *args, *TINY[:2]])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert "Traceback" not in result.output


def test_missing_config_file_is_a_clear_error():
    result = runner.invoke(app, ["run", "nope.yaml"])
    assert result.exit_code == 2
    assert "nope.yaml: no such file" in result.output


def test_entry_point_runs_as_a_real_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "service", "run", "--units", "nau,nmu", "--operation", "mul",
         "--output", str(tmp_path / "r.json"), *TINY],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    bad = subprocess.run([sys.executable, "-m", "service", "run", "--units", "bogus"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "valid units" in bad.stderr and "Traceback" not in bad.stderr
