"""The race panel reads a raced sweep's block-by-block figures: one line per setting over
the seeds it had after each block, ending where it left; no panel for a sweep that did
not race."""

from __future__ import annotations

from types import SimpleNamespace

from service.report.race_panels import race


def _data(blocks, raced=True, by_steps=()):
    standings = (("a", "incumbent"), ("b", "eliminated after block 1"), ("c", ""),
                 *((k, "stopped by steps in block 1") for k in by_steps))
    trials = [SimpleNamespace(run_id=k, name=f"trial-{k}", race=standing, params={"lr": "0.1"})
              for k, standing in standings]
    view = SimpleNamespace(trials=trials)
    return SimpleNamespace(view=view, raced=raced, race_blocks=blocks, searched=["lr"])


def test_one_line_per_setting_over_its_seeds_ending_where_it_left():
    blocks = {"a": [(8, 1.0, 0.68, 1.0), (16, 0.9375, 0.72, 0.99)], "b": [(8, 0.0, 0.0, 0.32)]}
    panel = race(_data(blocks), {})
    assert [t.name for t in panel.figure.data] == ["trial-a: incumbent", "trial-b: eliminated after block 1"]
    incumbent, eliminated = panel.figure.data
    assert list(incumbent.x) == [8, 16] and list(incumbent.y) == [1.0, 0.9375]
    assert list(eliminated.x) == [8]  # it left after its first block
    assert incumbent.error_y.arrayminus[1] == 0.9375 - 0.72 and incumbent.error_y.array[0] == 0.0
    assert panel.table[1][:3] == ["trial-a", "16", "incumbent"] and panel.table[2][:3] == ["trial-b", "8",
                                                                                           "eliminated after block 1"]
    assert "24 seed runs in all" in panel.note and "would have been 32" in panel.note


def test_a_sweep_that_did_not_race_has_no_race_panel():
    assert race(_data({}, raced=False), {}) is None
    assert "no block of the race" in race(_data({}), {}).note


def test_a_setting_stopped_by_steps_is_listed_not_drawn():
    blocks = {"a": [(8, 1.0, 0.68, 1.0)], "b": [(8, 0.0, 0.0, 0.32)]}
    panel = race(_data(blocks, by_steps=("d",)), {})
    assert [t.name for t in panel.figure.data] == ["trial-a: incumbent", "trial-b: eliminated after block 1"]
    assert panel.table[-1][:4] == ["trial-d", "—", "stopped by steps in block 1", "—"]
    assert "Stopped by steps inside their first block" in panel.note and "1 more (in the table)" in panel.note
    assert "stopped by steps in their first block: 1" in race(_data({}, by_steps=("d",)), {}).note
