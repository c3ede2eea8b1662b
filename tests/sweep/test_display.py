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
        a, b, c = _Trial("a", {"lr": 0.01}), _Trial("b", {"lr": 0.1}), _Trial("c", {"lr": 1.0})
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
