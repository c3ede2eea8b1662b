"""benchmarks/gpu_wheels.py, which packs the packages a GPU machine lacks: what it carries
(the project's dependency closure less the GPU machine's packages), what it trims, and the
archive it writes. The download and the 3.11 check (`--verify`) need the network and
minutes; these parts need neither."""

from __future__ import annotations

import importlib.util
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_wheels", REPO / "benchmarks" / "gpu_wheels.py")
gpu_wheels = importlib.util.module_from_spec(_spec)
sys.modules["gpu_wheels"] = gpu_wheels
_spec.loader.exec_module(gpu_wheels)


def test_it_carries_the_sweep_stack_and_nothing_the_gpu_machine_has():
    carry = gpu_wheels.to_carry("3.12")
    for name in ("ray", "optuna", "mlflow", "pydantic", "pydantic-core", "plotly", "sqlalchemy", "alembic"):
        assert name in carry, name
    have = gpu_wheels.device_packages()
    assert {"torch", "numpy", "pandas", "pyyaml", "rich", "typer"} <= have
    assert not (set(carry) & have) - {"protobuf", "typing-extensions"}  # ALWAYS_CARRY only
    assert "torch" not in carry
    # pinned to the versions installed here, which the project's tests ran with
    from importlib.metadata import version
    assert carry["ray"] == version("ray") and carry["mlflow"] == version("mlflow")


def test_trim_removes_what_a_sweep_never_reads_and_keeps_the_rest(tmp_path):
    site = tmp_path / "site"
    keep = ["ray/tune/__init__.py", "ray/data/__init__.py", "ray/dashboard/agent.py", "mlflow/__init__.py",
            "plotly/package_data/plotly.min.js"]
    drop = ["ray/jars/ray_dist.jar", "ray/rllib/__init__.py", "ray/dashboard/client/build/index.html",
            "ray/tune/tests/test_x.py", "mlflow/server/js/build/index.js", "optuna/__pycache__/x.pyc",
            "plotly/package_data/widgetbundle.js"]
    for rel in keep + drop:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x" * 100)
    removed = gpu_wheels.trim(site)
    assert removed == 100 * len(drop)
    for rel in keep:
        assert (site / rel).is_file(), rel
    for rel in drop:
        assert not (site / rel).exists(), rel
    archive = gpu_wheels.pack(site, tmp_path / "out")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert set(keep) <= names and not names & set(drop)
