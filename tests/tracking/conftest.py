"""A sweep's SQLite store for a test module: its experiment (named after the module) and a
parent sweep run. Module-scoped: creating the store's tables costs seconds."""

from __future__ import annotations

import pytest

from service.tracking import runs, store


@pytest.fixture(scope="module")
def tracking(tmp_path_factory, request):
    """``(uri, client, experiment_id, parent_run_id)``."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    uri = store.default_tracking_uri(tmp_path_factory.mktemp("mlflow"))
    client = store.client(uri)
    experiment_id = store.ensure_experiment(client, name, uri)
    parent = runs.start_sweep_run(client, experiment_id, name, space_file=None, spec_json="{}",
                                  spec_hash="abc", storage_path="/tmp/x", params={"trials": 1})
    return uri, client, experiment_id, parent
