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
