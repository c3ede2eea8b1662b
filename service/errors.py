"""Turn validation failures into one clear paragraph: where, what, and what is allowed."""

from __future__ import annotations

from pydantic import ValidationError


class UserError(Exception):
    """A mistake in the user's input; the CLI prints the message and exits with code 2."""


def _location(loc: tuple) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif "[" in str(item) or "-" in str(item) and str(item).startswith("function"):
            continue  # pydantic's internal validator names
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def describe_validation_error(err: ValidationError, source: str | None = None) -> str:
    """``source: a.b must ...`` lines for every problem pydantic found."""
    prefix = f"{source}: " if source else ""
    lines = []
    for e in err.errors(include_url=False):
        msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        where = _location(tuple(e["loc"]))
        got = ""
        if e["type"] not in ("missing",) and "input" in e and not isinstance(e["input"], dict):
            text = repr(e["input"])
            got = f" (got {text[:80]})"
        lines.append(f"{prefix}{where}: {msg}{got}")
    return "\n".join(lines)
