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
