"""Shared test settings: one thread per test process keeps timings stable on 2 cores."""

import os

import pytest
import torch

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_mlflow_in_cwd(tmp_path, monkeypatch):
    """Tests never write result files or tracking stores into the repository."""
    monkeypatch.chdir(tmp_path)
    yield
