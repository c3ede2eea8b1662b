"""How numbers and addresses are shown to people: one formatter for tables, boards and
reports, and one redaction for URIs (a password never reaches a terminal, log or page)."""

from __future__ import annotations

import math
import re
from typing import Any

MISSING = "—"


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` (missing, text, NaN, ±inf)."""
    if isinstance(value, bool):
        return float(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def fmt_number(value: Any, spec: str = ".3g") -> str:
    """A number for a table cell: ``format(value, spec)``, or ``—`` when it is not a finite
    number."""
    v = finite(value)
    return MISSING if v is None else format(v, spec)


def floor_to(value: float, digits: int = 2) -> float:
    """``value`` rounded down to ``digits`` decimals: a lower interval end shown beside a
    threshold (0.7985 as 0.79, never 0.80 when 0.8 is the bar it misses)."""
    scale = 10 ** digits
    return math.floor(round(value * scale, 6)) / scale


def ceil_to(value: float, digits: int = 2) -> float:
    """``value`` rounded up to ``digits`` decimals (an upper interval end)."""
    scale = 10 ** digits
    return math.ceil(round(value * scale, 6)) / scale


def fmt_interval(low: Any, high: Any, sep: str = ", ", digits: int = 2) -> str:
    """``0.79, 0.98``: an interval rounded outwards (its lower end down, its upper end up),
    so a shown end never crosses a threshold the true one does not; ``""`` when either is
    not a finite number."""
    lo, hi = finite(low), finite(high)
    if lo is None or hi is None:
        return ""
    return f"{floor_to(lo, digits):.{digits}f}{sep}{ceil_to(hi, digits):.{digits}f}"


def fmt_param(value: Any) -> str:
    """A parameter value (a logged string or a Python value): numbers to 3 significant
    digits, integers as they are, anything else as text; ``—`` when missing."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format(value, ".3g") if math.isfinite(value) else str(value)
    text = str(value)
    if text.lstrip("-").isdigit():
        return text
    if any(ch.isdigit() for ch in text):
        try:
            return format(float(text), ".3g")
        except ValueError:
            return text
    return text


def redact(uri: str) -> str:
    """``scheme://user:***@host/db``: a URI (or a message holding one) fit for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", uri)


def settings_label(params: dict[str, Any], names: list[str] | None = None, limit: int = 250) -> str:
    """A trial's settings as a short name, ``lr=0.012 optimizer=adam`` (``names`` in order,
    default every parameter), at most ``limit`` characters; ``(fixed settings)`` when empty.
    It depends on the settings only, never on a rank or an id."""
    keys = [k for k in (names if names is not None else list(params)) if k in params]
    text = " ".join(f"{k}={fmt_param(params[k])}" for k in keys) or "(fixed settings)"
    return text if len(text) <= limit else text[:limit - 1] + "…"
