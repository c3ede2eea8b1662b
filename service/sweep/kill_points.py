"""A test hook: the moments at which a test kills a sweep's driver, deterministically.

A resume must cope with a driver killed at any moment, and the interesting moments are
short (between a trial's end and Tune's next snapshot of its experiment). A test that
sleeps and then kills hits them by luck; instead it sets ``NALU_SWEEP_KILL_AT`` to
``<moment>[:<n>]`` and the driver SIGKILLs itself the ``n``-th time (default the first)
it reaches ``<moment>``, exactly as ``kill -9`` of the driver would leave the sweep: no
handler runs, Ray's workers of the sweep are left to the cluster to reap, its MLflow runs
stay open. Unset (everywhere outside those tests) the hook does nothing.

The moments (`MOMENTS`):

- ``before_trials``: Tune runs, no trial asked yet (the searcher's first ``suggest``);
- ``trial_started``: a trial was just asked from Optuna, before Tune snapshots it;
- ``trial_finished``: Tune just reported a trial's end and the study was told, before
  Tune's next snapshot (which still holds the trial as running);
- ``race_decided``: a racing scheduler just decided a block's report (and tagged the
  standings it changed), before Tune's next snapshot, with the trial's next block asked
  or its trial stopping;
- ``validation``: ``--validate K``'s trainings are running, none recorded yet.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

ENV = "NALU_SWEEP_KILL_AT"
MOMENTS = ("before_trials", "trial_started", "trial_finished", "race_decided", "validation")

_reached: Counter[str] = Counter()


def reached(moment: str) -> None:
    """Count ``moment``; SIGKILL this process if ``NALU_SWEEP_KILL_AT`` names this time."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != moment:
        return
    _reached[moment] += 1
    if _reached[moment] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
