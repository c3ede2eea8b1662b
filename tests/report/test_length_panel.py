"""The success-vs-sequence-length panel reads the per-length metrics of recurrent trials."""

from __future__ import annotations

from types import SimpleNamespace

from service.report.sequence_panels import success_vs_length


def _data(trials, recurrent=True):
    return SimpleNamespace(ranked=lambda top=None: trials[:top], validations={}, recurrent=recurrent)


def test_one_line_per_top_setting_over_the_test_lengths():
    metrics = {"n_seeds": 8.0, "success_rate_per_range.length_1": 1.0, "success_rate_per_range.length_1000": 0.25,
               "success_rate_per_range.length_10": 0.5, "success_rate": 0.25}
    trials = [SimpleNamespace(name="a", metrics=metrics), SimpleNamespace(name="b", metrics={**metrics, "n_seeds": 4.0})]
    panel = success_vs_length(_data(trials), {"top": 5})
    assert len(panel.figure.data) == 2
    line = panel.figure.data[0]
    assert list(line.x) == [1, 10, 1000] and list(line.y) == [1.0, 0.5, 0.25]
    assert line.error_y.arrayminus[0] > 0 and line.error_y.array[0] == 0  # 8/8: Wilson upper end 1


def test_a_static_sweep_has_no_length_panel_and_a_recurrent_one_waits_for_its_trials():
    trials = [SimpleNamespace(name="a", metrics={"n_seeds": 8.0, "success_rate_per_range.extrapolation": 1.0})]
    assert success_vs_length(_data(trials, recurrent=False), {}) is None
    assert success_vs_length(_data(trials, recurrent=None), {}) is None  # space unknown, no lengths logged
    assert "no per-length metrics yet" in success_vs_length(_data([], recurrent=True), {}).note
