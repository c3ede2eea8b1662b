"""The one place YAML is read: search spaces, run configs and dashboards.

``yaml.SafeLoader`` only (plain data: mappings, lists, text, numbers, booleans, dates; never
a Python object), and the file is bounded before it is trusted: at most ``MAX_BYTES``
bytes, ``MAX_DEPTH`` levels of nesting, and ``MAX_NODES`` values *after* aliases are
expanded (an "alias bomb" of nested ``*refs`` is small on disk but huge in memory);
recursive aliases are refused. Every failure is one line naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent

from service.errors import UserError

MAX_BYTES = 1_000_000
MAX_DEPTH = 64
MAX_NODES = 100_000


class _LimitError(yaml.YAMLError):
    """A document over one of the limits (raised while composing, before any value exists)."""


class BoundedSafeLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` with limits on nesting depth and on the size of the expanded
    document; recursive aliases (``&a [*a]``) are refused."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._open_anchors: list[str | None] = []
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            if event.anchor in self._open_anchors:
                raise _LimitError(f"the alias *{event.anchor} refers to a value that contains it "
                                  f"(line {event.start_mark.line + 1}); recursive aliases are not allowed")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _LimitError(f"nested more than {MAX_DEPTH} levels deep (line {event.start_mark.line + 1})")
        self._open_anchors.append(getattr(event, "anchor", None))
        try:
            node = super().compose_node(parent, index)
        finally:
            self._open_anchors.pop()
            self._depth -= 1
        self._sizes[id(node)] = size = 1 + sum(self._sizes.get(id(child), 1) for child in _children(node))
        if size > MAX_NODES:
            raise _LimitError(f"more than {MAX_NODES:,} values once aliases are expanded "
                              f"(line {event.start_mark.line + 1}); write the values out or use fewer aliases")
        return node


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _describe_yaml_error(e: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as one line: what was wrong, and where."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(x for x in (e.problem, f"({e.context})" if e.context else None) if x)
        if "python/" in (e.problem or ""):
            what += "; tags that build Python objects are never loaded (plain data only)"
        return f"not valid YAML{where}: {what or 'unreadable'}"
    return f"not valid YAML: {' '.join(str(e).split())}"


def read_text(path: Path, error: type[UserError] = UserError) -> str:
    """The file's text, UTF-8, at most ``MAX_BYTES`` bytes."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not a YAML file") from None
    except OSError as e:
        raise error(f"{path}: cannot read it ({e.strerror or e})") from None
    if len(raw) > MAX_BYTES:
        raise error(f"{path}: larger than {MAX_BYTES:,} bytes; a YAML file here is a few kilobytes")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None


def parse_yaml(text: str, source: str, error: type[UserError] = UserError) -> Any:
    """Plain data from YAML text (``None`` for an empty document), within the limits."""
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise error(f"{source}: {_describe_yaml_error(e)}") from None
    except (ValueError, OverflowError) as e:  # e.g. a date such as 2024-13-45
        raise error(f"{source}: not valid YAML: a value cannot be read ({e})") from None
    except RecursionError:
        raise error(f"{source}: not valid YAML: nested too deeply") from None


def load_yaml(path: str | Path, error: type[UserError] = UserError) -> Any:
    """Read and parse a YAML file safely; raises ``error`` with a one-line message."""
    path = Path(path)
    return parse_yaml(read_text(path, error), str(path), error)


def empty_file(path: str | Path, error: type[UserError] = UserError) -> UserError:
    """The one message for a file with nothing in it (0 bytes, or only blank lines and
    comments): every verb refuses it rather than running on its defaults."""
    return error(f"{path}: the file is empty (nothing but whitespace or comments)")


def load_mapping(path: str | Path, error: type[UserError] = UserError) -> dict[str, Any]:
    """A YAML file whose top level is a mapping; an empty file is an error (`empty_file`):
    running on the defaults instead of the settings a user meant to give is a silent mistake."""
    data = load_yaml(path, error)
    if data is None:
        raise empty_file(path, error)
    if not isinstance(data, dict):
        raise error(f"{path}: the top level must be a mapping (key: value), not {type(data).__name__}")
    return data
