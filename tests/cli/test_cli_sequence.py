"""`nalu-sweep run` on the recurrent tasks: trains end to end and prints the per-length table."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()


@pytest.mark.parametrize("operation", ["sum", "prod"])
def test_run_sequential_digits_prints_a_per_length_table(tmp_path, operation):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("task: {kind: sequential_digits, eval_samples: 20, reference_steps: 30, "
                   "test_lengths: [1, 2, 12]}\n")
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["run", str(cfg), "--operation", operation, "--seeds", "2", "--steps", "6",
                                 "--eval-every", "3", "--quiet", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "per test length" in result.output and "longest length solved" in result.output
    data = json.loads(out.read_text())
    assert set(data["thresholds"]) == {"length_1", "length_2", "length_12", "readout"}
    assert "prod" in result.output if operation == "prod" else "sum" in result.output
    assert set(data["seeds"][0]["success_per_range"]) == {"length_1", "length_2", "length_12", "readout"}
    assert "read-out (per-step MSE)" in result.output
    assert data["sequence"]["test_lengths"] == [1, 2, 12] and len(data["sequence"]["longest_length_solved"]) == 2


def test_run_rejects_an_extrapolation_range_for_a_sequence_task(tmp_path):
    result = runner.invoke(app, ["run", "--task", "sequence_arithmetic", "--extrapolation", "U[2,6]",
                                 "--quiet", "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "test_lengths" in result.output
