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
