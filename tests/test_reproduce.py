"""`benchmarks/reproduce.py` end to end on a tiny budget: it trains every model of a
protocol, prints and writes the paper's table layout beside the published figures, and
reports a model whose configuration does not validate as "not available"."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _benchmark(name: str):
    """The script ``benchmarks/NAME.py`` as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _reproduce():
    return _benchmark("reproduce")


@pytest.mark.slow  # ~10 s (four tiny trainings and the success threshold)
def test_small_mul_writes_the_papers_table(tmp_path, capsys):
    rep = _reproduce()
    out = tmp_path / "out"
    assert rep.main(["small_mul", "--seeds", "2", "--steps", "200", "--device", "cpu", "--out", str(out)]) == 0
    data = json.loads((out / "small_mul.json").read_text())
    assert data["shortened"] and data["seeds"] == 2 and data["steps"] == 200 and data["protocol_steps"] == 200_000
    assert [c["row"]["model"] for c in data["cells"]] == ["Linear", "NAC•", "NALU", "NMU"]
    for cell in data["cells"]:
        assert cell["status"] == "ok" and set(rep.COLUMNS) <= set(cell["row"])
        assert cell["aggregate"]["n_seeds"] == 2 and len(cell["seeds"]) == 2
        assert {"sparsity_error", "final_sparsity_error", "best_step"} <= set(cell["seeds"][0])
        # the protocol's settings are those stated: regulariser off, Adam 1e-3, batch 128
        train = cell["config"]["train"]
        assert train["regularizer"]["lambda_max"] == 0 and train["optimizer"]["lr"] == 1e-3
        assert train["batch_size"] == 128 and train["eval_every"] == 200
    nmu = data["cells"][3]["row"]
    assert nmu["paper: success"].startswith("94%") and nmu["paper: sparsity error"].startswith("2.6e-8")
    table = (out / "small_mul.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| op"))
    assert [c.strip() for c in header.strip("|").split("|")] == rep.COLUMNS
    assert table.count("| × |") == 4
    printed = capsys.readouterr().out
    assert "success [95% CI]" in printed and "SHORTENED" in printed


def test_a_model_that_does_not_validate_gets_a_not_available_row(tmp_path):
    rep = _reproduce()
    broken = rep.Model("Broken", [{"unit": "nalu", "options": {"no_such_option": 1}}, {"unit": "nmu"}])
    protocol = rep.PROTOCOLS["small_mul"]
    args = type("Args", (), {"seeds": 1, "steps": 10, "device": "cpu"})()
    cell = rep.run_cell(protocol, "mul", broken, args)
    assert cell["status"] == "not available" and "no_such_option" in cell["reason"]
    assert cell["row"]["success [95% CI]"] == "not available" and cell["row"]["model"] == "Broken"


def test_the_committed_nac_mul_outcomes_follow_the_current_initial_signs(capsys):
    """The README explains the NAC• row by its seeds' initial signs, from the committed
    `benchmarks/reproduce_small_mul.json`. The script rebuilds those initial weights with
    the initialisation the file records (docs/reproducing.md): a change of either makes
    them another draw than the one the committed outcomes came from, and this fails."""
    module = _benchmark("nac_mul_init_signs")
    split = module.main([str(ROOT / "benchmarks" / "reproduce_small_mul.json")])
    seeds = sum(n for n, _ in split.values())
    solved = sum(s for _, s in split.values())
    assert seeds == 100 and solved > 0
    # on the committed draw: no seed that started with both NAC• weights negative solved,
    # and most of those that started with both positive did, few with one (4 of 53)
    assert split[0][1] == 0, split
    assert split[2][1] > split[2][0] / 2 and split[1][1] < split[1][0] / 4, split
    assert "positive Ŵ" in capsys.readouterr().out


def test_the_reference_init_script_trains_from_the_reference_draw(capsys):
    """`benchmarks/nac_mul_reference_init.py` on a tiny budget: the reference's second draw
    (after two ``reset_parameters``) for each seed is what the trainer starts from."""
    module = _benchmark("nac_mul_reference_init")
    import torch

    torch.manual_seed(3)
    first = torch.empty(2, 4).uniform_(-1, 1)  # the first draw's uniforms, on [-1, 1]
    w1, w2 = module.reference_initial_weights(3)
    assert w1[0].shape == (2, 4) and w2[0].shape == (1, 2)
    assert float(w2[0].abs().max()) > 1.0  # drawn from U[-9.47, 9.47], not the first layer's range
    # the second draw, not the first: the first draw scaled back to [-1, 1] would equal it
    assert not torch.allclose(w1[0] / module.nac_init_range(4, 2), first)
    split = module.main(["--seeds", "4", "--steps", "20"])
    assert sum(n for n, _ in split.values()) == 4
    assert "from the reference's initial weights of seeds 0-3" in capsys.readouterr().out


@pytest.mark.slow  # ~10 s: three tiny cells, two of them in child processes
def test_jobs_train_each_cell_in_its_own_process_with_the_same_seeds(tmp_path, capsys):
    """``--jobs 2`` runs each cell as a child process of the script and writes one table of
    them all; a seed's outcome does not depend on which process trained it."""
    rep = _reproduce()
    common = ["small_mul", "--seeds", "2", "--steps", "200", "--device", "cpu"]
    assert rep.main([*common, "--models", "NALU,NMU", "--jobs", "2", "--out", str(tmp_path / "jobs")]) == 0
    data = json.loads((tmp_path / "jobs" / "small_mul.json").read_text())
    assert [(c["row"]["model"], c["status"]) for c in data["cells"]] == [("NALU", "ok"), ("NMU", "ok")]
    assert sorted(p.name for p in (tmp_path / "jobs" / "cells").iterdir()) == ["mul-NALU", "mul-NMU"]
    assert rep.main([*common, "--models", "NMU", "--out", str(tmp_path / "one")]) == 0
    alone = json.loads((tmp_path / "one" / "small_mul.json").read_text())["cells"][0]
    assert data["cells"][1]["seeds"] == alone["seeds"]
    assert "2 models at a time" in capsys.readouterr().out


def test_a_models_operations_train_as_one_batch_with_each_cells_own_outcomes(tmp_path, capsys):
    """The arithmetic protocol trains a model's four operations as one seed batch; every
    cell's per-seed outcomes are those of the cell trained on its own (``--cell-by-cell``)."""
    rep = _reproduce()
    common = ["arithmetic", "--seeds", "2", "--steps", "200", "--models", "NMU", "--device", "cpu"]
    assert rep.main([*common, "--out", str(tmp_path / "packed")]) == 0
    assert "add,sub,mul,div NMU: 8 seeds as one batch" in capsys.readouterr().out
    assert rep.main([*common, "--cell-by-cell", "--out", str(tmp_path / "apart")]) == 0
    packed = json.loads((tmp_path / "packed" / "arithmetic.json").read_text())["cells"]
    apart = json.loads((tmp_path / "apart" / "arithmetic.json").read_text())["cells"]
    assert [c["trained_with"] for c in packed] == [["add", "sub", "mul", "div"]] * 4
    assert [c["trained_with"] for c in apart] == [["add"], ["sub"], ["mul"], ["div"]]
    assert [c["seeds"] for c in packed] == [c["seeds"] for c in apart]
    assert [c["thresholds"] for c in packed] == [c["thresholds"] for c in apart]
    assert len({json.dumps(c["seeds"]) for c in packed}) == 4  # four targets: four outcomes


def test_a_cell_whose_process_fails_gets_a_failed_row(tmp_path, monkeypatch, capsys):
    rep = _reproduce()
    monkeypatch.setattr(sys, "executable", "/bin/false")  # every child exits 1 at once
    out = tmp_path / "out"
    assert rep.main(["small_mul", "--seeds", "2", "--steps", "20", "--jobs", "3", "--out", str(out)]) == 0
    data = json.loads((out / "small_mul.json").read_text())
    assert [c["status"] for c in data["cells"]] == ["failed"] * 4
    assert data["cells"][3]["row"]["success [95% CI]"] == "failed"
    assert "mul NMU: failed (exit status 1)" in capsys.readouterr().out


def test_merge_writes_the_table_of_cells_run_apart(tmp_path, capsys):
    """``--merge`` puts cells of earlier runs (here the committed H100 cells of the arithmetic
    protocol) in the protocol's order; the cells no file has are "not run"; files of another
    length or with the same cell twice are refused with a sentence, not a traceback."""
    rep = _reproduce()
    committed = ROOT / "benchmarks" / "reproduce_arithmetic.json"
    out = tmp_path / "out"
    assert rep.main(["arithmetic", "--merge", str(committed), "--out", str(out)]) == 0
    data = json.loads((out / "arithmetic.json").read_text())
    assert len(data["cells"]) == 28 and not data["shortened"]
    done = [(c["row"]["op"], c["row"]["model"]) for c in data["cells"] if c["status"] == "ok"]
    assert done == [("×", "NAC•"), ("×", "NMU")]
    assert sum(c["status"] == "not run" for c in data["cells"]) == 26
    assert "2 of 28 cells from 1 file(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="5000000 steps; this table is arithmetic with 100 × 1000"):
        rep.main(["arithmetic", "--merge", str(committed), "--steps", "1000", "--out", str(out)])
    with pytest.raises(SystemExit, match="more than one file"):
        rep.main(["arithmetic", "--merge", str(committed), str(committed), "--out", str(out)])


def test_the_committed_arithmetic_cells_are_the_papers_protocol():
    """The README's arithmetic rows come from `benchmarks/reproduce_arithmetic.json`: full
    length, 100 seeds, the protocol's settings as the script states them today."""
    rep = _reproduce()
    data = json.loads((ROOT / "benchmarks" / "reproduce_arithmetic.json").read_text())
    protocol = rep.PROTOCOLS["arithmetic"]
    assert (data["seeds"], data["steps"], data["shortened"]) == (100, protocol.steps, False)
    for cell in [c for c in data["cells"] if c["status"] == "ok"]:
        model = next(m for m in protocol.models if m.name == cell["row"]["model"])
        expected = rep.run_config(protocol, "mul", model, 100, protocol.steps, "cuda").model_dump(mode="json")
        assert cell["config"] == expected, model.name
        assert len(cell["seeds"]) == 100 and cell["aggregate"]["successes"] == sum(s["success"] for s in cell["seeds"])


def test_the_committed_arithmetic_nac_mul_outcomes_follow_the_current_initial_signs(capsys):
    """The README's reading of the arithmetic × NAC• row (run on an H100) by its seeds'
    initial signs, rebuilt on the CPU from the cell's config: the initial weights are drawn
    on the host, so they are the GPU run's; a change of the initialisation fails this."""
    module = _benchmark("nac_mul_init_signs")
    split = module.main([str(ROOT / "benchmarks" / "reproduce_arithmetic.json")])
    assert split == {0: (27, 14), 1: (48, 3), 2: (25, 25)}
    assert "NAC• × on arithmetic" in capsys.readouterr().out


@pytest.mark.slow  # ~15 s: one cell trained whole, and once killed at a checkpoint and resumed
def test_a_killed_cell_resumes_from_its_checkpoint_to_the_same_outcome(tmp_path, capsys):
    """A protocol run killed (SIGKILL) in the middle of a cell continues with ``--resume``
    from the cell's last checkpoint and ends with the same per-seed outcomes, bit for bit,
    as the run never stopped; the finished cell keeps no checkpoint."""
    import os
    import signal
    import subprocess
    import time

    rep = _reproduce()
    args = ["small_mul", "--seeds", "2", "--steps", "8000", "--models", "NMU", "--device", "cpu",
            "--checkpoint-every", "1"]
    killed = tmp_path / "killed"
    checkpoint = killed / "cells" / "mul-NMU" / "checkpoint.pt"
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "reproduce.py"), *args, "--out", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert checkpoint.exists() and not (killed / "small_mul.json").exists()

    assert rep.main([*args, "--out", str(killed), "--resume"]) == 0
    printed = capsys.readouterr().out
    import re

    resumed_at = int(re.search(r"mul NMU: resuming from step (\d+)", printed).group(1))
    progress = [int(n) for n in re.findall(r"mul NMU: step (\d+)/8000", printed)]
    assert resumed_at >= 1000 and progress and min(progress) > resumed_at  # continued, not restarted
    assert not checkpoint.exists()
    assert rep.main([*args, "--out", str(tmp_path / "whole")]) == 0
    resumed = json.loads((killed / "small_mul.json").read_text())["cells"][0]
    whole = json.loads((tmp_path / "whole" / "small_mul.json").read_text())["cells"][0]
    assert resumed["seeds"] == whole["seeds"] and resumed["aggregate"] == whole["aggregate"]


def test_resume_refuses_cells_of_another_length(tmp_path):
    rep = _reproduce()
    out = tmp_path / "out"
    assert rep.main(["small_mul", "--seeds", "2", "--steps", "20", "--models", "NMU", "--out", str(out)]) == 0
    with pytest.raises(SystemExit, match="has 2 seeds × 20 steps, this run 2 × 40"):
        rep.main(["small_mul", "--seeds", "2", "--steps", "40", "--models", "NMU", "--out", str(out), "--resume"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal without a GPU")
def test_the_gpu_step_breakdown_says_it_needs_a_gpu(capsys):
    module = _benchmark("gpu_step_breakdown")
    assert module.main([]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err
