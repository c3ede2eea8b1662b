"""The one rule for a sweep's name.

A sweep name becomes an MLflow experiment name, a directory under the Tune storage path
(``runs/NAME``) and part of spool paths, so it must be safe as all three on every file
system: plain ASCII letters and digits, ``_``, ``.`` and ``-``, starting with a letter or
digit (a leading ``-`` would read as a flag, a leading ``.`` as a hidden file), at most
``MAX_SWEEP_NAME`` characters.
"""

from __future__ import annotations

import re

MAX_SWEEP_NAME = 100
SWEEP_NAME_RULE = (f"ASCII letters, digits, '_', '.' and '-' only, starting with a letter or digit, "
                   f"at most {MAX_SWEEP_NAME} characters (e.g. 'nalu-gates_2')")
_SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def sweep_name_problem(name: object) -> str | None:
    """What is wrong with ``name`` as a sweep name, or ``None`` when it is a valid one."""
    if not isinstance(name, str):
        return f"a sweep name must be text, not {type(name).__name__}; {SWEEP_NAME_RULE}"
    if not name:
        return f"an empty sweep name; {SWEEP_NAME_RULE}"
    if len(name) > MAX_SWEEP_NAME:
        return f"a sweep name of {len(name)} characters; {SWEEP_NAME_RULE}"
    if _SWEEP_NAME.fullmatch(name) is None:
        return f"not a valid sweep name: {SWEEP_NAME_RULE}"
    return None


def require_sweep_name(name: object, where: str = "--name") -> str:
    """``name`` if it is a valid sweep name; otherwise a ``UserError`` (``--name 'a b': not
    a valid sweep name: …``) that says the rule."""
    from service.errors import UserError

    problem = sweep_name_problem(name)
    if problem is not None:
        raise UserError(f"{where} {name!r}: {problem}")
    return name  # type: ignore[return-value]
