"""Turn validation failures into one clear paragraph: where, what, and what is allowed."""

from __future__ import annotations

from typing import Any, Iterable

from pydantic import ValidationError


class UserError(Exception):
    """A mistake in the user's input; the CLI prints the message and exits with code 2."""


def is_internal_loc(item: Any, tags: Iterable[str] = ()) -> bool:
    """True for the parts of a pydantic error location that are pydantic's own (validator
    and union member names) or a discriminated union's ``tags``, not the user's keys."""
    text = str(item)
    return "[" in text or text.startswith("function-") or text in tags


def error_message(e: dict[str, Any]) -> str:
    """One pydantic error in the user's words: the message without pydantic's prefixes, an
    unknown key called so, and what was given (unless it was missing or a mapping)."""
    if e["type"] == "extra_forbidden":
        return "unknown key"
    msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if e["type"] != "missing" and "input" in e and not isinstance(e["input"], dict):
        msg += f" (got {repr(e['input'])[:80]})"
    return msg


def _location(loc: tuple) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif not is_internal_loc(item):
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def describe_validation_error(err: ValidationError, source: str | None = None) -> str:
    """``source: a.b must ...`` lines for every problem pydantic found."""
    prefix = f"{source}: " if source else ""
    return "\n".join(f"{prefix}{_location(tuple(e['loc']))}: {error_message(e)}"
                     for e in err.errors(include_url=False))


def did_you_mean(word: Any, options: Iterable[Any]) -> str:
    """``"did you mean 'choices'?"`` for the option closest to a misspelt ``word`` (``""``
    when none is close: difflib's ratio ≥ 0.6)."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f"did you mean {close[0]!r}?" if close else ""


def unknown_key_message(key: Any, allowed: Iterable[Any] | None, what: str = "unknown key",
                        allowed_label: str = "allowed") -> str:
    """``unknown key; did you mean 'x'? allowed: a, b`` (parts left out when unknown)."""
    options = list(allowed) if allowed is not None else []
    hint = did_you_mean(key, options)
    text = what + (f"; {hint}" if hint else "")
    if allowed is not None:
        text += f"{'' if hint else ';'} {allowed_label}: {', '.join(map(str, options)) or '(none)'}"
    return text
