"""The availability probes are compile-time constants without importing dynamo at import
time (`service.native.constant`)."""

from __future__ import annotations

import subprocess
import sys

import torch

from service.native import compile_time_constant
from service.seeding import generator
from service.units import kernels


def test_mark_is_exactly_what_torch_sets() -> None:
    def ours() -> bool:
        return True

    def torchs() -> bool:
        return True

    assert compile_time_constant(ours) is ours
    assert torch.compiler.assume_constant_result(torchs) is torchs
    assert vars(ours) == vars(torchs) and vars(ours)  # the same, non-empty marker


def test_probes_are_constants_in_a_full_graph() -> None:
    """dynamo must not trace into the probes (file locks, ctypes): with the mark missing,
    fullgraph compilation of a function that asks them fails."""
    torch._dynamo.reset()

    def pick(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if generator.native_available() and kernels.native_available() else x - 1

    x = torch.zeros(3)
    assert torch.equal(torch.compile(pick, fullgraph=True, dynamic=False)(x), pick(x))


def test_training_imports_leave_dynamo_unloaded() -> None:
    """The sweep driver, an eager trial and `run` import these; dynamo costs ~1.5 s of CPU and
    is loaded only when a step is compiled."""
    code = ("import sys, service.config, service.sweep.trainable, service.training.trainer; "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
