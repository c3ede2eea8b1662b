"""The verdict after a choice (issue 44 item 7): a setting picked as the best of K on the
very seeds that judge it gets the Bonferroni-widened interval, which for K = 1 is today's
95% Wilson interval; the verdict's own setting, picked on the search's seeds before its
fresh seeds were drawn, keeps its plain interval, and the sentence says so."""

from __future__ import annotations

import pytest

from service.scoring.intervals import best_of_interval, wilson_interval
from service.scoring.verdict import best_of_validated


@pytest.mark.parametrize(("successes", "n"), [(32, 32), (31, 32), (5, 8), (0, 4)])
def test_the_bound_for_one_setting_is_todays(successes, n):
    assert best_of_interval(successes, n, 1) == wilson_interval(successes, n)


def test_choosing_among_more_settings_widens_the_interval():
    bounds = [best_of_interval(31, 32, k) for k in (1, 3, 10)]
    assert bounds[0][0] > bounds[1][0] > bounds[2][0]  # a lower lower end the more were compared
    assert bounds[0][1] < bounds[1][1] < bounds[2][1]  # and a higher upper end
    assert best_of_interval(31, 32, 3) == wilson_interval(31, 32, 1 - 0.05 / 3)
    with pytest.raises(ValueError, match="at least 1"):
        best_of_interval(3, 4, 0)


def test_the_sentence_names_the_best_validation_and_its_widened_interval():
    validated = [("trial-a", {"successes": 29, "n_seeds": 32}), ("trial-b", {"successes": 32, "n_seeds": 32}),
                 ("trial-c", {"successes": 20, "n_seeds": 32})]
    text = best_of_validated(validated, "trial-a")
    low = best_of_interval(32, 32, 3)[0]
    assert text.startswith("Of the 3 validated settings, trial-b did best on its fresh seeds (32/32)")
    assert f"[{int(low * 100) / 100:.2f}, 1.00]" in text and low < wilson_interval(32, 32)[0]
    assert "The verdict judges the search's best, trial-a," in text
    assert best_of_validated(validated[:1], "trial-a") is None  # one validated setting: no choice made
