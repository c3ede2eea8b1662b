"""The package's shape, checked over its source (AST): data flows one way through layers,
no module reaches into another's private names, no C hides in Python strings, and no
module grows past what a reader takes in at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[1] / "service"
MAX_LINES = 420

# Lowest first: a package may import from its own layer's modules or from lower layers only.
LAYERS: list[set[str]] = [
    {"errors", "limits", "names", "formatting", "frozen", "yamlio", "endpoints"},
    {"native"},
    {"seeding"},
    {"units", "tasks"},
    {"config", "pack_structure"},
    {"scoring"},
    {"training"},
    {"engine"},
    {"search"},
    {"tracking"},
    {"sweep"},
    {"report"},
    {"cli", "__main__"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> list[Path]:
    return sorted(p for p in SERVICE.rglob("*.py") if "__pycache__" not in p.parts)


def _top(path: Path) -> str:
    """``service/sweep/driver.py`` → ``sweep``; ``service/config.py`` → ``config``."""
    rel = path.relative_to(SERVICE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(SERVICE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split("."))
    root = SERVICE.parent
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every ``service`` import in the file, at any depth (imports
    inside functions count: a lazy import is still a dependency)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "service":
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.split(".")[0] == "service")
    return out


def _imported_packages(path: Path) -> set[str]:
    found = set()
    for module, names in _imports(path):
        parts = module.split(".")
        if len(parts) > 1:
            found.add(parts[1])
        else:  # from service import x
            found.update(names)
    return found - {_top(path)}


def test_every_package_has_a_layer():
    tops = {_top(p) for p in _modules()} - {"__init__"}
    assert tops <= set(LAYER_OF), f"not in LAYERS: {sorted(tops - set(LAYER_OF))}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICE)))
def test_imports_point_down_the_layers(path):
    top = _top(path)
    if top == "__init__":
        return
    upward = sorted(t for t in _imported_packages(path) if LAYER_OF.get(t, -1) > LAYER_OF[top])
    assert not upward, f"{path.relative_to(SERVICE)} ({top}) imports a higher layer: {upward}"


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for path in _modules():
        graph.setdefault(_top(path), set()).update(_imported_packages(path))
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        if state.get(node) == 1:
            return trail[trail.index(node):] + [node]
        if state.get(node) == 2:
            return None
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt, trail + [node])
            if cycle:
                return cycle
        state[node] = 2
        return None

    for node in sorted(graph):
        cycle = visit(node, [])
        assert cycle is None, "package import cycle: " + " → ".join(cycle)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICE)))
def test_no_private_name_crosses_a_module(path):
    """``from service.x import _y`` and ``x_module._y`` from another module are both out:
    a name two modules share is public, or it lives where both belong."""
    me = _dotted(path)
    bad = []
    module_aliases: set[str] = set()
    for module, names in _imports(path):
        for name in names:
            if _is_module(f"{module}.{name}"):
                module_aliases.add(name)
            elif name.startswith("_") and not name.startswith("__") and module != me:
                bad.append(f"from {module} import {name}")
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("service.") and a.asname:
                    module_aliases.add(a.asname)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            bad.append(f"{node.value.id}.{node.attr}")
    assert not bad, f"{path.relative_to(SERVICE)} uses private names of other modules: {bad}"


C_MARKERS = ("#include", "#ifdef", "#define ", "typedef ", "static inline", "__m256")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICE)))
def test_no_c_source_in_python_strings(path):
    """C lives in ``.c`` files shipped as package data (`service/native/`), where a compiler,
    an editor and a reviewer see it as C."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            hits = [m for m in C_MARKERS if m in node.value]
            assert not hits, f"{path.relative_to(SERVICE)}:{node.lineno}: C source in a string ({hits})"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICE)))
def test_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(SERVICE)} has {lines} lines (> {MAX_LINES}): split it by idea"
