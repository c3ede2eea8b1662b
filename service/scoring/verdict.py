"""The verdict on a setting, from the lower end of the 95% Wilson interval of its success
rate (on fresh seeds when it was validated, else during the search): ``robust`` from 0.8,
``promising`` from 0.5, otherwise ``not robust``. One rule for the report, the parent
run's description and the end of ``nalu-sweep sweep --validate``."""

from __future__ import annotations

from dataclasses import dataclass

ROBUST_LOW = 0.8
PROMISING_LOW = 0.5

_WORDS = {
    "robust": "robust",
    "promising": "promising but not proven",
    "not_robust": "not robust: too few seeds succeed, or too few seeds were tried",
}


@dataclass(frozen=True)
class Verdict:
    key: str  # robust, promising, not_robust
    ci_low: float
    validated: bool  # judged on fresh seeds (else on the search's own seeds)

    @property
    def words(self) -> str:
        return _WORDS[self.key]

    def sentence(self) -> str:
        from service.formatting import floor_to

        basis = "on fresh seeds" if self.validated else "during the search, not yet validated"
        return (f"Verdict: {self.words} (the lower end of the 95% interval is {floor_to(self.ci_low):.2f}, "
                f"{basis}).")


def verdict(ci_low: float | None, validated: bool) -> Verdict | None:
    """The verdict for a lower interval end, or ``None`` when it is unknown."""
    if ci_low is None:
        return None
    key = "robust" if ci_low >= ROBUST_LOW else "promising" if ci_low >= PROMISING_LOW else "not_robust"
    return Verdict(key, float(ci_low), validated)


def best_of_validated(validated: list[tuple[str, dict[str, float]]], judged: str | None) -> str | None:
    """A sentence on choosing among several validated settings (``(name, validation
    metrics)``, ``judged``: the name of the setting the verdict judges), or None for fewer
    than two. The verdict judges the search's best, picked before its fresh seeds were
    drawn, so its 95% interval needs no widening; a reader who picks instead the best of the
    K validations on those very seeds makes a choice among K, whose interval is the wider
    `best_of_interval` (Bonferroni over the K), given here."""
    from service.formatting import fmt_interval
    from service.scoring.intervals import best_of_interval, wilson_interval

    counted = [(name, int(m["successes"]), int(m["n_seeds"])) for name, m in validated
               if m.get("successes") is not None and m.get("n_seeds")]
    if len(counted) < 2:
        return None
    k = len(counted)
    name, successes, n = max(counted, key=lambda c: (wilson_interval(c[1], c[2])[0], c[2]))
    low, high = best_of_interval(successes, n, k)
    text = (f"Of the {k} validated settings, {name} did best on its fresh seeds ({successes}/{n}); picked for "
            f"that, its 95% interval is [{fmt_interval(low, high)}], widened for the choice among {k} "
            f"(Bonferroni).")
    if judged is not None:
        text += (f" The verdict judges the search's best, {judged}, picked before its fresh seeds were drawn, "
                 f"so its interval needs no such widening.")
    return text
