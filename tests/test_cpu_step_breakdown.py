"""`benchmarks/cpu_step_breakdown.py` at a tiny size: it measures the draw, the step and the
evaluation (the native CPU step's, and the torch step's beside it), writes what it prints,
and its ceiling is the seeds over the draw and the evaluation alone."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import pytest

from service.training import cpu_step

ROOT = Path(__file__).resolve().parents[1]


def test_the_breakdown_runs_and_its_ceiling_is_the_draws():
    spec = importlib.util.spec_from_file_location("cpu_step_breakdown", ROOT / "benchmarks" / "cpu_step_breakdown.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "breakdown.json"
        figures = module.main(["--seeds", "3", "--steps", "100", "--compile", "off", "--no-compiled-baseline",
                               "--json", str(out)])
        assert json.loads(out.read_text()) == figures
    assert figures["seeds"] == 3 and figures["compiled"] is False and "--compile off" in figures["command"]
    assert figures["native_step"] == cpu_step.available()
    if figures["native_step"]:  # the same run's torch step timed beside it; no torch ops to profile
        assert figures["torch_eager_step_ms"] > 0 and figures["ops"] is None
        assert "torch_compiled_step_ms" not in figures  # --no-compiled-baseline
    else:
        assert figures["ops"] and all(0 < share <= 1 for share in figures["ops"].values())
    # (at 3 seeds a draw timed alone is mostly its call's overhead, which the native step's
    # blocks of 50 steps in one call do not pay: no order between the draw and the step here)
    assert figures["draw_ms"] > 0 and 0 < figures["step_ms"] <= figures["step_ms_median"]
    ceiling = 3 / ((figures["draw_ms"] + figures["eval_ms_per_step"]) / 1e3)
    assert figures["ceiling_seed_steps_per_s"] == pytest.approx(ceiling, rel=0.01)
    assert figures["seed_steps_per_s"] == pytest.approx(
        3 / ((figures["step_ms"] + figures["eval_ms_per_step"]) / 1e3), rel=0.01)
    base = figures["avx2_baseline"]
    if figures["instruction_set"] == "AVX-512":  # the AVX2 baseline, timed in the same run
        assert base["draw_ms"] > 0 and base["step_ms"] > 0 and base["avx512_step_ms"] > 0
        assert base["step_ratio"] == pytest.approx(base["step_ms"] / base["avx512_step_ms"], rel=0.01)
    else:
        assert base is None
