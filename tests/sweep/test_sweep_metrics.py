"""The sweep's figures for Prometheus (`service.sweep.metrics`), computed from Tune's events
alone; their export through a real Ray and Prometheus is tests/cluster/test_prometheus.py."""

from __future__ import annotations

import pickle

from service.sweep.metrics import SweepFigures, SweepMetrics, trial_steps
from service.sweep.results import PACK_MEMBERS


def test_seed_steps_per_second_per_trial_from_its_reports():
    figures = SweepFigures(seeds=4)
    figures.started(["a"], "10.0.0.1")
    figures.trials["a"].at = 100.0
    ((key, node, rate, new),) = figures.result({"a": (50, 1)}, "10.0.0.2", now=102.0)
    assert (key, node, new) == ("a", "10.0.0.2", 200) and rate == 100.0  # 4 seeds × 50 steps in 2 s
    ((_, _, rate, new),) = figures.result({"a": (150, 3)}, "10.0.0.2", now=106.0)
    assert new == 400 and rate == 100.0
    ((_, _, rate, new),) = figures.result({"a": (150, 3)}, "10.0.0.2", now=107.0)  # no progress
    assert new == 0 and rate == 0.0
    assert figures.solved() == 3


def test_counts_and_solved_over_trials():
    figures = SweepFigures(seeds=2)
    figures.started(["a", "b", "c"], "n")
    figures.result({"a": (10, 2), "b": (10, 1)}, "n", now=1.0)
    figures.trials["b"].state = "pruned"
    assert figures.counts() == {"running": 2, "done": 0, "pruned": 1, "failed": 0}
    assert figures.solved() == 3  # a pruned trial's solved seeds still count


def test_trial_steps_of_a_lone_trial_and_of_a_pack():
    assert trial_steps("t1", {"lr": 0.1}, {"step": 40, "successes": 2}) == {"t1": (40, 2)}
    assert trial_steps("t1", {"lr": 0.1}, {"step": 40}) == {"t1": (40, None)}
    pack = {PACK_MEMBERS: [{}, {}]}
    result = {"members/0/step": 30, "members/0/successes": 1, "members/1/step": 20, "objective": 0.5}
    assert trial_steps("t2", pack, result) == {"t2.0": (30, 1), "t2.1": (20, None)}


def test_the_callback_pickles_as_its_settings():
    callback = SweepMetrics("s", seeds=3, total_steps=100)
    callback.figures.started(["x"], "n")
    copy = pickle.loads(pickle.dumps(callback))
    assert (copy.sweep, copy.seeds, copy.total_steps) == ("s", 3, 100)
    assert copy.figures.trials == {}


class _Trial:
    trial_id, config = "t1", {"lr": 0.1}


def test_an_export_error_turns_the_export_off_and_never_reaches_the_sweep(caplog):
    class Broken(SweepMetrics):
        calls = 0

        def metrics(self):
            Broken.calls += 1
            raise RuntimeError("no agent")

    callback = Broken("s", seeds=1, total_steps=10)
    callback.on_trial_start(0, [], _Trial())
    callback.on_trial_result(0, [], _Trial(), {"step": 5})
    callback.on_trial_complete(0, [], _Trial())
    assert Broken.calls == 1 and "no agent" in caplog.text


class _Pack:
    trial_id, config = "p1", {PACK_MEMBERS: [{}, {}]}


def test_the_callback_records_through_a_real_ray(ray_address):
    """Lone trials and packs through `ray.util.metrics` on the test session's Ray (which has
    no metrics agent: the values are recorded, then dropped); nothing fails, and the figures
    follow the events: a member ASHA stops inside its pack, a trial stopped short is pruned."""
    callback = SweepMetrics("s", seeds=2, total_steps=100)
    callback.on_trial_start(0, [], _Trial())
    callback.on_trial_start(0, [], _Pack())
    callback.on_trial_result(0, [], _Trial(), {"step": 50, "successes": 1, "node_ip": "10.0.0.1"})
    callback.on_trial_result(0, [], _Pack(), {"members/0/step": 40, "members/0/state": "pruned",
                                              "members/1/step": 40, "members/1/successes": 2, "node_ip": "10.0.0.2"})
    assert callback.figures.counts() == {"running": 2, "done": 0, "pruned": 1, "failed": 0}
    callback.on_trial_complete(0, [], _Trial())  # at step 50 of 100: stopped early
    callback.on_trial_result(0, [], _Pack(), {"members/1/step": 100, "members/1/state": "done", "node_ip": "10.0.0.2"})
    callback.on_trial_complete(0, [], _Pack())
    assert not callback._broken
    assert callback.figures.counts() == {"running": 0, "done": 1, "pruned": 2, "failed": 0}
    assert callback.figures.solved() == 3
    assert callback.figures.trials["p1.1"].node == "10.0.0.2"
