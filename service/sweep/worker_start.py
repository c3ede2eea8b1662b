"""What a Ray worker of a sweep's own local Ray does as it starts, before its first task.

`cluster.prepared_workers` makes `prepare` Ray's worker-process setup hook while that Ray
starts. While the sweep's trials run (a tracking URI is announced: `helper.announced`) every
worker is a trial's worker: it starts its MLflow helper, or connects to the driver that
answers its tracking calls (`helper.prestart`, `driver_tracking`), and loads what a trial
runs, Ray Tune (to unpickle the trainable) and the trial's code with torch; it then starts
its plotting process (`plot_server`), which loads matplotlib while the first trial trains.
A worker that Ray prestarts when the driver connects (`ray_head.raylet_command`) does this
while the driver sets up Tune, so the first trial finds it loaded; a worker Ray starts for
a trial does the same work it would have done at the trial's first step. Afterwards (`validate`'s
workers on a Ray that `sweep --validate` kept) a worker loads nothing."""

from __future__ import annotations

from service.tracking import helper, plot_server


def prepare() -> None:
    """Ray's setup hook; it never raises (an exception would end the worker): whatever
    failed to load here loads, or fails, where the trial imports it."""
    if not helper.prestart():
        return
    try:
        from ray import tune  # noqa: F401 - the trainable's class unpickles into Ray Tune

        from service.sweep import trial, trial_state  # noqa: F401 - torch and the training code
    except Exception:  # noqa: BLE001, S110 - only a head start
        pass
    plot_server.start()
