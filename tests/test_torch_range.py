"""The torch that pyproject.toml allows is the torch CI tests.

CI (`.ci/run`) installs the package and runs the suite under whatever torch the range
resolves to, so the claim "torch X works" is honest only when the range admits one minor
release, the floor's, and the suite runs under it. This file fails when the installed
torch lies outside the range, is not the floor's minor release, or the range admits a
later minor release than the one tested.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from packaging.requirements import Requirement
from packaging.version import Version

from service.config import RunConfig
from service.training import Trainer

ROOT = Path(__file__).resolve().parents[1]


def torch_line() -> str:
    """The torch requirement as pyproject.toml writes it, e.g. ``torch>=2.13,<2.14``."""
    text = (ROOT / "pyproject.toml").read_text()
    (line,) = re.findall(r'^\s*"(torch\b[^"]*)",?\s*$', text, re.M)
    return line


def torch_requirement() -> Requirement:
    return Requirement(torch_line())


def test_the_range_admits_exactly_the_floors_minor_release() -> None:
    spec = torch_requirement().specifier
    floors = [Version(s.version) for s in spec if s.operator == ">="]
    assert len(floors) == 1, f"torch needs one '>=' floor: {spec}"
    floor = floors[0]
    assert floor in spec
    assert Version(f"{floor.major}.{floor.minor}.99") in spec
    # nothing below the floor's minor, nothing from the next minor on
    assert Version(f"{floor.major}.{floor.minor - 1}.99") not in spec
    assert Version(f"{floor.major}.{floor.minor + 1}.0") not in spec
    assert Version(f"{floor.major + 1}.0.0") not in spec


def test_the_installed_torch_is_the_tested_floor() -> None:
    spec = torch_requirement().specifier
    installed = Version(torch.__version__)
    assert spec.contains(installed), f"torch {installed} is outside pyproject's {spec}"
    floor = next(Version(s.version) for s in spec if s.operator == ">=")
    assert installed.release[:2] == floor.release[:2], (
        f"CI tests torch {installed}, but pyproject's floor is {floor}")


def test_readme_states_the_range() -> None:
    assert f"`{torch_line()}`" in (ROOT / "README.md").read_text()


def test_a_torch_without_trace_autograd_ops_still_compiles_the_step(monkeypatch) -> None:
    """`trace_autograd_ops` first exists in torch 2.11; the trainer only sets it where it
    exists (an older torch would break the graph at the gradient, not crash)."""

    real = torch._dynamo.config

    class ConfigWithoutTheKey:  # the real config, less the key (as in torch < 2.11)
        def __getattr__(self, name):
            if name == "trace_autograd_ops":
                raise AttributeError(name)
            return getattr(real, name)

        def __setattr__(self, name, value):
            if name == "trace_autograd_ops":
                raise AttributeError(name)
            setattr(real, name, value)

    monkeypatch.setattr(torch._dynamo, "config", ConfigWithoutTheKey())
    cfg = RunConfig.model_validate({
        "task": {"kind": "small_mul", "eval_samples": 100, "threshold_samples": 10_000},
        "model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]},
        "train": {"steps": 2, "batch_size": 4, "eval_every": 1},
        "seeds": 2, "device": "cpu", "compile": "on",
    })
    assert Trainer(cfg).compiled  # the step is wrapped by torch.compile, nothing raised
