"""`benchmarks/cpu_step_breakdown.py` at a tiny size: it measures the draw, the step and the
evaluation, writes what it prints, and its ceiling is the seeds over the draw and the
evaluation alone."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_breakdown_runs_and_its_ceiling_is_the_draws():
    spec = importlib.util.spec_from_file_location("cpu_step_breakdown", ROOT / "benchmarks" / "cpu_step_breakdown.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "breakdown.json"
        figures = module.main(["--seeds", "3", "--steps", "100", "--compile", "off", "--json", str(out)])
        assert json.loads(out.read_text()) == figures
    assert figures["seeds"] == 3 and figures["compiled"] is False and "--compile off" in figures["command"]
    assert 0 < figures["draw_ms"] < figures["step_ms"] <= figures["step_ms_median"]
    ceiling = 3 / ((figures["draw_ms"] + figures["eval_ms_per_step"]) / 1e3)
    assert figures["ceiling_seed_steps_per_s"] == pytest.approx(ceiling, rel=0.01)
    assert figures["ceiling_seed_steps_per_s"] > figures["seed_steps_per_s"] > 0
    assert figures["ops"] and all(0 < share <= 1 for share in figures["ops"].values())
    base = figures["avx2_baseline"]
    if figures["instruction_set"] == "AVX-512":  # the AVX2 baseline, timed in the same run
        assert base["draw_ms"] > 0 and base["step_ms"] > 0 and base["avx512_step_ms"] > 0
        assert base["step_ratio"] == pytest.approx(base["step_ms"] / base["avx512_step_ms"], rel=0.01)
    else:
        assert base is None
