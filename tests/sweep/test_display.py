"""The live board a Tune callback feeds (no Ray needed to drive it)."""

from __future__ import annotations

import pickle

from rich.console import Console

from service.sweep.display import (
    LiveProgress,
    SweepBoard,
    register_board,
    unregister_board,
)


class _Trial:
    def __init__(self, trial_id, config):
        self.trial_id, self.config = trial_id, config


def test_board_follows_trial_events_through_the_callback():
    console = Console(record=True, width=160, force_terminal=False)
    board = SweepBoard("demo", total_trials=3, total_steps=1000, console=console)
    register_board(board)
    try:
        callback = pickle.loads(pickle.dumps(LiveProgress("demo")))  # as restored from Tune's state
        a, b, c = (_Trial("a", {"lr": 0.01, "__run_configs__": {"t": "a whole RunConfig"}}),
                   _Trial("b", {"lr": 0.1}), _Trial("c", {"lr": 1.0}))
        for t in (a, b, c):
            callback.on_trial_start(0, [], t)
        callback.on_trial_result(0, [], a, {"step": 1000, "objective": 0.42, "successes": 12, "n_seeds": 16,
                                            "success_ci_low": 0.42, "success_ci_high": 0.9})
        callback.on_trial_complete(0, [], a)
        callback.on_trial_result(0, [], b, {"step": 250, "objective": 0.0})
        callback.on_trial_complete(0, [], b)
        callback.on_trial_error(0, [], c)
    finally:
        unregister_board(board)
    assert board.counts() == {"running": 0, "done": 1, "pruned": 1, "failed": 1}
    assert board.best().name == "a"
    console.print(board.render())
    text = console.export_text()
    assert "1 pruned" in text and "1 failed" in text and "best 0.420 (a)" in text
    assert "12/16 [0.42, 0.90]" in text and "lr=0.01" in text
    assert "__run_configs__" not in text and "RunConfig" not in text  # the driver's, not the user's


def test_board_says_what_it_waits_for_and_estimates_the_time_left():
    console = Console(record=True, width=160, force_terminal=False)
    board = SweepBoard("demo", total_trials=6, total_steps=1000, console=console, concurrency=2)
    console.print(board.render())
    assert "waiting for Ray to start the first trials" in console.export_text()
    assert board.eta_s() is None  # nothing finished: no guess
    board.trial_started("a", {"lr": 0.1})
    board.trial_started("b", {"lr": 0.2})
    assert "ETA after the first trial" in _text(board)
    a, b = board.trials["a"], board.trials["b"]
    a.started, b.started = 0.0, 50.0
    board.trial_result("a", {}, {"step": 1000})
    board.trial_finished("a", {})
    a.ended = 100.0  # a took 100 s
    # at t=100: b needs ~50 s more, 4 trials wait (400 s of work): 450 s over 2 at a time
    assert board.eta_s(now=100.0) == 225.0
    assert "left" in _text(board)


def _text(board: SweepBoard) -> str:
    console = Console(record=True, width=200, force_terminal=False)
    console.print(board.render())
    return console.export_text()


def test_optuna_study_stop_noise_is_kept_out_of_the_sweep_output():
    import logging

    from service.sweep.cluster import STUDY_STOP_NOISE, quiet_libraries

    quiet_libraries(verbose=False)
    search_log = logging.getLogger("ray.tune.search.optuna.optuna_search")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    search_log.addHandler(handler)  # Ray's loggers do not propagate to pytest's
    try:
        search_log.warning(RuntimeError(STUDY_STOP_NOISE + " or a callback."))
        search_log.warning("a real problem")
    finally:
        search_log.removeHandler(handler)
    assert seen == ["a real problem"]


def test_ray_token_auth_notice_is_dropped_not_other_warnings(monkeypatch):
    import logging

    import ray

    from service.sweep.cluster import init_ray

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no Ray is started here
    handlers = logging.getLogger("ray").handlers
    assert handlers  # Ray's own, set up by its import
    for h in handlers:
        monkeypatch.setattr(h, "filters", list(h.filters))
    said = []
    assert init_ray(None, verbose=False, say=said.append) is False
    assert init_ray(None, verbose=False, say=said.append) is False  # one filter, however often

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("ray.anything", logging.WARNING, __file__, 1, message, None, None)

    notice = record("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled ...")
    for h in handlers:
        assert not h.filter(notice)
        assert h.filter(record("a real problem"))
        assert sum(type(f).__name__ == "_DropAuthNotice" for f in h.filters) == 1


def test_the_wait_for_ray_is_announced(monkeypatch):
    import ray

    from service.sweep import cluster

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    calls: list[dict] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(cluster, "started_here", lambda: True)
    said: list[str] = []
    assert cluster.init_ray(None, verbose=False, say=said.append) is True
    assert calls[0]["address"] is None  # Ray's own choice: a running local cluster, or a new one
    assert said[0] == "looking for a running local Ray…"
    assert said[1].startswith("started a local Ray for this sweep") and "(2 CPUs)" in said[1], said
    assert "ray start --head" in said[1]


def test_a_pack_shows_one_line_per_member():
    """With ``pack: K`` a Tune trial is a pack: the board counts and shows its members."""
    console = Console(record=True, width=160, force_terminal=False)
    board = SweepBoard("demo", total_trials=3, total_steps=1000, console=console)
    config = {"__pack__": [{"number": 0, "params": {"lr": 0.01}}, {"number": 1, "params": {"lr": 0.2}},
                           {"number": 2, "params": {"lr": 0.5}}]}
    board.trial_started("p", config)
    assert board.counts() == {"running": 3, "done": 0, "pruned": 0, "failed": 0}
    board.trial_result("p", config, {"step": 500, "members/0/step": 500, "members/0/state": "running",
                                     "members/1/step": 500, "members/1/state": "pruned",
                                     "members/1/objective": 0.1, "members/2/step": 500, "members/2/state": "running"})
    board.trial_result("p", config, {"step": 1000, "members/0/step": 1000, "members/0/state": "done",
                                     "members/0/objective": 0.7, "members/0/successes": 3, "members/0/n_seeds": 4,
                                     "members/1/step": 500, "members/1/state": "pruned"})
    board.trial_finished("p", config, error=True)  # the pack failed after its first member finished
    assert {k: t.state for k, t in board.trials.items()} == {"p.0": "done", "p.1": "pruned", "p.2": "failed"}
    assert board.best().name == "p.0" and board.best().successes == 3
    assert "lr=0.2" in _text(board)
