"""benchmarks/gpu_check.py, the one-call GPU check, exercised without a GPU: the JSON it
writes, the time limit of a part (its whole process group killed), the budget, parts missing
on disk, --parts, and a real part on the CPU (--device cpu); and gpu_results.py's tables."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")
gpu_results = _load("gpu_results")


def _dry_run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "check.json"
    assert gpu_check.main(["--dry-run", "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_dry_run_writes_every_part_in_order_with_the_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("NALU_SWEEP_COMMIT", "abc123")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    report = _dry_run(tmp_path)
    assert report["schema"] == gpu_check.SCHEMA and report["dry_run"] is True
    assert report["machine"]["commit"] == "abc123"
    assert [p["name"] for p in report["parts"]] == [p.name for p in gpu_check.PARTS]
    for part in report["parts"]:
        assert set(part) >= {"name", "about", "status"}, part
        assert part["status"] == "dry-run" or part["status"].startswith("skipped: "), part
        assert ("command" in part) == (part["status"] == "dry-run"), part
    cuda = next(p for p in report["parts"] if p["name"] == "cuda_tests")
    assert "tests/training/test_cuda.py" in cuda["command"] and "tests/sweep/test_gpu_sweep.py" in cuda["command"]
    assert "test_torch_range" not in cuda["command"]  # it fails on the GPU machine's older torch by design
    # $OUT gets the same JSON and the log
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text()) == report
    assert "cuda_tests" in (tmp_path / "out" / "gpu_check.log").read_text()


def test_parts_missing_on_disk_are_skipped_as_absent(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)  # a checkout with no tests and no benchmarks
    report = _dry_run(tmp_path)
    for part in report["parts"]:
        assert part["status"].startswith("skipped: absent"), part
    (tmp_path / "tests" / "training").mkdir(parents=True)
    (tmp_path / "tests" / "training" / "test_cuda_capture.py").write_text("")
    (tmp_path / "tests" / "engine").mkdir()
    report = _dry_run(tmp_path)
    status = {p["name"]: p["status"] for p in report["parts"]}
    assert status["capture"] == status["engine_tests"] == "dry-run"
    assert status["cuda_tests"].startswith("skipped: absent")  # test_cuda_capture.py is the capture part's


def test_parts_selects_and_orders_and_refuses_unknown_names(tmp_path, capsys):
    report = _dry_run(tmp_path, "--parts", "throughput,cuda_tests")
    assert [p["name"] for p in report["parts"]] == ["throughput", "cuda_tests"]
    with pytest.raises(SystemExit, match="unknown part.*nope.*the parts are: cuda_tests"):
        gpu_check.main(["--dry-run", "--parts", "throughput,nope"])
    with pytest.raises(SystemExit, match="--budget must be positive"):
        gpu_check.main(["--dry-run", "--budget", "0"])


def _parent_of_a_sleeper(pid_file: Path, then: str) -> gpu_check.Part:
    """A part that starts a child sleeping for a minute, writes its pid, then runs `then`."""
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(c.pid)); print('started', flush=True); {then}")
    return gpu_check.Part("parent", "starts a sleeper", 60, lambda settings, scratch: [sys.executable, "-c", code])


def _gone(pid: int) -> None:
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    pytest.fail(f"process {pid} outlived its part")


def test_a_part_past_its_limit_is_killed_with_its_children(tmp_path):
    """The part sleeps past its limit: it and its child go at the limit."""
    part = _parent_of_a_sleeper(tmp_path / "child.pid", "time.sleep(60)")
    started = time.perf_counter()
    record = gpu_check.run_part(part, gpu_check.Settings(device="cpu"), 3.0, lambda text: None)
    assert time.perf_counter() - started < 30
    assert record["status"] == "timeout" and record["timeout_s"] == 3
    assert record["tail"] == ["started"]
    _gone(int((tmp_path / "child.pid").read_text()))


def test_what_a_finished_part_leaves_running_is_stopped(tmp_path):
    """The part exits at once, its child (holding the part's output open) still sleeping: the
    part counts as finished, and the child goes before the next part."""
    part = _parent_of_a_sleeper(tmp_path / "child.pid", "pass")
    started = time.perf_counter()
    record = gpu_check.run_part(part, gpu_check.Settings(device="cpu"), 30, lambda text: None)
    assert record["status"] == "passed" and time.perf_counter() - started < 20
    _gone(int((tmp_path / "child.pid").read_text()))


def test_the_budget_skips_what_would_start_too_late_and_each_part_is_saved(tmp_path):
    quick = gpu_check.Part("quick", "prints", 30, lambda s, d: [sys.executable, "-c", "print('hi')"])
    failing = gpu_check.Part("failing", "exits 3", 30, lambda s, d: [sys.executable, "-c", "raise SystemExit(3)"])
    slow = gpu_check.Part("slow", "sleeps", 30, lambda s, d: [sys.executable, "-c", "import time; time.sleep(2)"])
    broken = gpu_check.Part("broken", "cannot build", 30, lambda s, d: 1 / 0)
    report: dict = {"parts": []}
    saved: list[int] = []
    gpu_check.run_all([quick, failing, broken, slow, quick], gpu_check.Settings(device="cpu"), 3.0, report,
                      lambda: saved.append(len(report["parts"])), lambda text: None, min_part_s=1.0)
    status = [p["status"] for p in report["parts"]]
    assert status[:2] == ["passed", "failed"] and status[3] == "passed", report
    assert status[2].startswith("error: could not build the command: ZeroDivisionError"), report
    assert report["parts"][1]["returncode"] == 3
    assert status[4] == "skipped: budget", report  # the budget was spent by the slow part
    assert saved == [1, 2, 3, 4, 5]


def test_pytest_parts_count_passed_failed_and_skipped(tmp_path):
    tests = tmp_path / "test_sample.py"
    tests.write_text("import pytest\n"
                     "def test_ok():\n    assert True\n"
                     "def test_bad():\n    assert 1 == 2\n"
                     "@pytest.mark.skip(reason='no GPU here')\ndef test_skip():\n    pass\n")
    part = gpu_check.Part("tests", "a sample", 120,
                          lambda settings, scratch: gpu_check.pytest_command(settings, scratch, [str(tests)]),
                          gpu_check.junit)
    record = gpu_check.run_part(part, gpu_check.Settings(device="cpu"), 120, lambda text: None)
    assert record["status"] == "failed"
    figures = record["figures"]
    assert (figures["passed"], figures["failed"], figures["errors"], figures["skipped"]) == (1, 1, 0, 1)
    # junit names a test by its module's dotted path from pytest's rootdir, which for a file
    # outside the repository depends on where the two lie
    assert len(figures["failures"]) == 1 and figures["failures"][0].endswith("test_sample::test_bad")
    assert "no GPU here" in figures["skips"][0]


def test_a_pytest_part_stopped_at_its_limit_keeps_the_counts_it_showed(tmp_path):
    tests = tmp_path / "test_slow.py"
    tests.write_text("import time\ndef test_ok():\n    pass\ndef test_hangs():\n    time.sleep(120)\n")
    part = gpu_check.Part("tests", "a hanging test", 120,
                          lambda settings, scratch: gpu_check.pytest_command(settings, scratch, [str(tests)]),
                          gpu_check.junit)
    record = gpu_check.run_part(part, gpu_check.Settings(device="cpu"), 8, lambda text: None)
    assert record["status"] == "timeout"
    assert record["figures"]["passed"] == 1 and record["figures"]["failed"] == 0, record
    assert "no report" in record["figures"]["incomplete"]


def test_commit_comes_from_the_environment_then_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NALU_SWEEP_COMMIT", "from-env")
    assert gpu_check.commit() == "from-env"
    monkeypatch.delenv("NALU_SWEEP_COMMIT")
    monkeypatch.setattr(gpu_check, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)  # no .git here
    (tmp_path / "COMMIT").write_text("from-file\n")
    assert gpu_check.commit() == "from-file"
    (tmp_path / "COMMIT").unlink()
    assert gpu_check.commit() == "unknown"


@pytest.mark.slow
def test_the_trainer_level_sweep_part_runs_on_the_cpu(tmp_path):
    """The real sweep_throughput.py at tiny sizes through the check: its rows come back."""
    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--parts", "sweep_trainer", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (part,) = report["parts"]
    assert part["status"] == "passed", part
    (row,) = part["figures"]["rows"]
    assert row["pack"] == 2 and row["packed_s"] > 0 and row["one_by_one_s"] > 0
    assert report["machine"]["cuda_available"] is False and report["machine"]["torch"]
    table = gpu_results.render(report)
    assert "sweep_trainer" in table and "passed" in table


@pytest.mark.slow  # ~10 s: a tiny arithmetic protocol (one model's four operations as one batch)
def test_the_table1_part_runs_on_the_cpu_and_projects(tmp_path):
    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--parts", "table1_rate", "--json", str(out)]) == 0
    (part,) = json.loads(out.read_text())["parts"]
    assert part["status"] == "passed", part
    f = part["figures"]
    assert f["cells"] == 4 and f["seeds"] == 2 and f["steps"] == 200 and f["engine_cells"] == 0
    assert f["table1_projected_s"] == pytest.approx(gpu_check.TABLE1_SEED_STEPS / f["seed_steps_per_s"])
    assert "Table 1 projected" in gpu_results.summary(part)


@pytest.mark.slow  # ~20 s: two tiny trainings, one of them in Triton's interpreter
def test_the_engine_outcomes_part_runs_on_the_cpu(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--parts", "engine_outcomes", "--json", str(out)]) == 0
    (part,) = json.loads(out.read_text())["parts"]
    assert part["status"] == "passed", part
    assert part["figures"] == {"NMU": "2/2 seeds the same outcome, engine rate inside the torch interval: ok"}


def test_results_render_each_kind_of_part_as_a_table_row():
    report = {"machine": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580", "torch": "2.11.0+cu130",
                          "torch_cuda": "13.0", "commit": "0123456789abcdef"}, "wall_s": 400, "parts": [
        {"name": "cuda_tests", "status": "failed", "wall_s": 60,
         "figures": {"passed": 24, "failed": 1, "errors": 0, "skipped": 0, "failures": ["t::test_x"]}},
        {"name": "throughput", "status": "passed", "wall_s": 70,
         "figures": {"by_seeds": {"100": {"seed_steps_per_s": 1190000, "x_reference": 30.1, "setup_s": 20.5}}}},
        {"name": "sweep_pack8", "status": "passed", "wall_s": 50,
         "figures": {"sweep_wall_s": 41.9, "seed_steps_per_s": 1000, "trials": 2, "outcomes": ["completed"] * 2,
                     "devices": ["cuda"]}},
        {"name": "recurrent_throughput", "status": "passed", "wall_s": 30,
         "figures": {"sequential_digits": [{"seeds": 16, "warm_seed_steps_per_s": 50000,
                                            "cold_seed_steps_per_s": 9000, "device": "cuda"}]}},
        {"name": "capture", "status": "skipped: absent"}]}
    table = gpu_results.render(report)
    assert "NVIDIA H100 80GB HBM3" in table and "commit 0123456789ab" in table
    assert "| cuda_tests | failed | 60 | 24 passed, 1 failed, 0 errors, 0 skipped (t::test_x) |" in table
    assert "S = 100: 1,190,000 seed·steps/s" in table and "| 100 | 1,190,000 | 30.1 | 20.5 |" in table
    assert "2 trials (2 completed) on cuda" in table
    assert "sequential_digits: S=16 50,000 seed·steps/s warm (9,000 cold) on cuda" in table
    assert "| capture | skipped: absent |  |  |" in table
