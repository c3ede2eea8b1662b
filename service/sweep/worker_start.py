"""What a Ray worker of a sweep's own local Ray does as it starts, before its first task.

`cluster.prepared_workers` makes `prepare` Ray's worker-process setup hook while that Ray
starts. While the sweep's trials run (a tracking URI is announced: `helper.announced`) every
worker is a trial's worker: it starts its MLflow helper, or connects to the driver that
answers its tracking calls (`helper.prestart`, `driver_tracking`), and loads what a trial
runs, Ray Tune (to unpickle the trainable, whose creation then skips an import of IPython:
`ipython_only_where_loaded`) and the trial's code with torch; it then starts its plotting
process (`plot_server`), which loads matplotlib while the first trial trains. A worker
that Ray prestarts when the driver connects (`ray_head.raylet_command`) does this while the
driver sets up Tune, so the first trial finds it loaded; a worker Ray starts for a trial
does the same work it would have done at the trial's first step. Afterwards (`validate`'s
workers on a Ray that `sweep --validate` kept) a worker loads nothing."""

from __future__ import annotations

import sys

from service.tracking import helper


def prepare() -> None:
    """Ray's setup hook; it never raises (an exception would end the worker): whatever
    failed to load here loads, or fails, where the trial imports it."""
    if not helper.prestart():
        return
    try:
        from ray import tune  # noqa: F401 - the trainable's class unpickles into Ray Tune

        ipython_only_where_loaded()
        from service.sweep import trial, trial_state  # noqa: F401 - torch and the training code
    except Exception:  # noqa: BLE001, S110 - only a head start
        pass
    from service.tracking import plot_server  # here: the driver imports this module too

    plot_server.start()


def ipython_only_where_loaded() -> None:
    """Ray Tune creates each trial's trainable with a call to its `disable_ipython`, which
    imports IPython wherever it is installed (about 0.5 s here, on a sweep's critical path:
    after the driver has scheduled the first trial) only to clear IPython's shell instance.
    A worker that never imported IPython has none; this worker's trainables then skip the
    import, and still clear the instance where IPython is loaded. Where Tune has no such
    function, nothing changes."""
    from ray.tune.trainable import trainable

    original = getattr(trainable, "disable_ipython", None)
    if original is None or getattr(original, "only_where_loaded", False):
        return

    def disable_ipython() -> None:
        if "IPython" in sys.modules:
            original()

    disable_ipython.only_where_loaded = True  # type: ignore[attr-defined]
    trainable.disable_ipython = disable_ipython
