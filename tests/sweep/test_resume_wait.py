"""A resumed sweep first waits for the killed driver's trials to leave Ray
(`cluster.wait_for_released_trials`): a worker that outlived its driver could otherwise
close its MLflow run after the resume read the runs back (real Ray, the session's)."""

from __future__ import annotations

import time

from service.sweep.cluster import wait_for_released_trials


def test_the_wait_ends_when_the_cpus_are_free_and_says_so_when_they_stay_held(ray_address):
    import ray

    @ray.remote(num_cpus=1)
    class Orphan:  # a trial's actor still holding its CPU
        def ping(self) -> bool:
            return True

    said: list[str] = []
    assert wait_for_released_trials(say=said.append, timeout_s=5)  # nothing held: at once
    assert said == []
    orphan = Orphan.remote()
    ray.get(orphan.ping.remote())
    started = time.monotonic()
    assert not wait_for_released_trials(say=said.append, timeout_s=1.5, poll_s=0.1)
    assert time.monotonic() - started >= 1.5
    assert said[-1].startswith("Ray still holds 1 CPU(s)") and "NALU_SWEEP_RESUME_WAIT_S" in said[-1]
    ray.kill(orphan)  # Ray reaps it: the wait ends once its CPU is back
    assert wait_for_released_trials(say=said.append, timeout_s=30, poll_s=0.1)
