"""The engine's tests run on CUDA when torch sees a GPU, else in Triton's interpreter on the
CPU (``TRITON_INTERPRET=1``, set before the kernels are imported), with fewer steps."""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> str:
    return "cuda" if CUDA else "cpu"


@pytest.fixture
def steps() -> int:
    """Training steps of a trajectory test: 2,000 on a GPU, a few in the interpreter (~1 s
    per seed and step)."""
    return 2000 if CUDA else 16
