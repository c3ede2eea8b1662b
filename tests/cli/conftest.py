"""A recorded store for the read-only verbs: two sweeps written straight through the MLflow
client as a sweep records them (`benchmarks/readonly_verbs.py`), no training."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench_store(tmp_path_factory):
    """A directory holding ``mlflow.db`` with sweep ``bench`` (8 trials) and ``other`` (3)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import readonly_verbs
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    root = tmp_path_factory.mktemp("store")
    readonly_verbs.build_store(root, "bench", 8)
    readonly_verbs.build_store(root, "other", 3, seed=1)
    return root
