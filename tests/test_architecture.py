"""The package's shape, checked over its source (AST): data flows one way through layers,
no module reaches into another's private names, no C hides in Python strings, and no
module grows past what a reader takes in at once."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[1] / "service"
MAX_LINES = 420

# Lowest first: a package may import from its own layer's modules or from lower layers only.
LAYERS: list[set[str]] = [
    {"errors", "limits", "names", "formatting", "frozen", "yamlio", "endpoints", "startup"},
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


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (``[a, b, …, a]``), or None."""
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
        if cycle:
            return cycle
    return None


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for path in _modules():
        graph.setdefault(_top(path), set()).update(_imported_packages(path))
    cycle = _cycle(graph)
    assert cycle is None, "package import cycle: " + " → ".join(cycle)


def _imported_modules(path: Path) -> set[str]:
    """The ``service`` modules a file imports (``from service.x import y`` names module
    ``service.x.y`` where that is a module, else ``service.x``), itself excluded."""
    found = set()
    for module, names in _imports(path):
        subs = [f"{module}.{n}" for n in names if _is_module(f"{module}.{n}")]
        found.update(subs or [module])
    return found - {_dotted(path)}


def test_no_import_cycle_between_modules():
    """Within a package too: a module that needs only a type or a value of a module that
    imports it takes it from lower down (a protocol, a module of its own)."""
    graph = {_dotted(path): _imported_modules(path) for path in _modules()}
    cycle = _cycle(graph)
    assert cycle is None, "module import cycle: " + " → ".join(cycle)


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


# -- dependencies used through their public interfaces (issue 34) ------------------------------------
# A private module or name of these is not theirs to keep stable; nor is anything of any dependency
# ours to replace. torch's `torch._dynamo.config` is documented for users to set.
PUBLIC_ONLY = ("ray", "mlflow", "optuna")
DEPENDENCIES = (*PUBLIC_ONLY, "torch", "matplotlib", "sqlalchemy", "alembic", "pandas", "numpy")
INTERNAL_PREFIXES = ("mlflow.store",)
DOCUMENTED_PRIVATE = ("torch._dynamo.config",)
MUTATING_METHODS = {"pop", "popitem", "update", "clear", "setdefault", "append", "extend", "insert", "remove",
                    "__setitem__", "__delitem__"}
# what rewrites the command line of a dependency's process: the underscore options of Ray's C++
# processes (``--num_prestart_python_workers=``), Ray's internal settings read from the environment
# (``RAY_prestart_worker_first_driver``; Ray's documented variables are upper case), its scripts
RAY_PROCESS_OPTION = re.compile(r"^--[a-z0-9]+(_[a-z0-9]+)+(=|$)")
RAY_INTERNAL_SETTING = re.compile(r"^RAY_[a-z][a-z0-9_]*$")
DEPENDENCY_SCRIPTS = ("agent.py", "main.py", "setup_worker.py", "default_worker.py")


def _is_private_part(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _internal(dotted: str) -> bool:
    """A dotted name of `PUBLIC_ONLY` with a private component, or one of their internal modules."""
    parts = dotted.split(".")
    if parts[0] not in PUBLIC_ONLY or any(dotted == d or dotted.startswith(d + ".") for d in DOCUMENTED_PRIVATE):
        return False
    return any(_is_private_part(p) for p in parts) or dotted.startswith(INTERNAL_PREFIXES)


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` → ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def dependency_misuse(source: str) -> list[str]:
    """What in ``source`` reaches into a dependency: a private or internal module or name of
    Ray, MLflow or Optuna, an attribute of any dependency replaced (assigned, ``setattr``,
    ``delattr``, a mutating call on it), or an option or setting of Ray's own processes."""
    tree = ast.parse(source)
    bad: list[str] = []
    bound: dict[str, str] = {}  # a local name → the dotted dependency name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in DEPENDENCIES:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    if _internal(a.name):
                        bad.append(f"import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in DEPENDENCIES:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    bound[a.asname or a.name] = full
                    if _internal(full):
                        bad.append(f"from {node.module} import {a.name}")
    # names assigned from a dependency's attributes (``x = ray.a.b``, ``x = getattr(mod, "y")``)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Call) and _chain(value.func) == ["getattr"] and value.args:
                value = value.args[0]
            chain = _chain(value)
            if chain and chain[0] in bound:
                bound.setdefault(node.targets[0].id, ".".join([bound[chain[0]], *chain[1:]]))

    def resolved(target: ast.AST) -> str | None:
        while isinstance(target, ast.Subscript):
            target = target.value
        chain = _chain(target)
        if not chain or chain[0] not in bound:
            return None
        return ".".join([bound[chain[0]], *chain[1:]])

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            full = resolved(node)
            if full and _internal(full) and not _internal(resolved(node.value) or ""):
                bad.append(f"uses {full}")
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for target in targets:
            if isinstance(target, (ast.Attribute, ast.Subscript)):
                full = resolved(target)
                if full and not full.startswith(DOCUMENTED_PRIVATE):
                    bad.append(f"replaces {full}")
        if isinstance(node, ast.Call):
            func = _chain(node.func)
            if func in (["setattr"], ["delattr"]) and node.args:
                full = resolved(node.args[0])
                if full and not full.startswith(DOCUMENTED_PRIVATE):
                    bad.append(f"{func[0]}({full}, …)")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in MUTATING_METHODS:
                full = resolved(node.func.value)
                if full:
                    bad.append(f"mutates {full} ({node.func.attr})")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if RAY_PROCESS_OPTION.match(text) or RAY_INTERNAL_SETTING.match(text):
                bad.append(f"a Ray process's own option or setting {text!r}")
    return sorted(set(bad))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICE)))
def test_dependencies_are_used_through_their_public_interfaces(path):
    misuse = dependency_misuse(path.read_text())
    assert not misuse, f"{path.relative_to(SERVICE)} reaches into a dependency: {misuse}"


@pytest.mark.parametrize("source, caught", [
    ("from ray._private import services", True),
    ("from ray import _private", True),
    ("import ray._private.worker", True),
    ("import ray\nnode = ray._private.worker._global_node", True),
    ("from mlflow.store.db import utils", True),
    ("import mlflow.store.tracking.sqlalchemy_store", True),
    ("from optuna.samplers._tpe import sampler", True),
    ("from ray.tune.trainable import trainable\ntrainable.disable_ipython = print", True),
    ("import ray\nray.init = print", True),
    ("import mlflow\nsetattr(mlflow, 'log_metric', print)", True),
    ("from ray.tune.execution import class_cache\nd = getattr(class_cache, 'DEFAULT_ENV_VARS')\nd.pop('X')", True),
    ("from ray.tune.execution import class_cache\nclass_cache.DEFAULT_ENV_VARS['X'] = '1'", True),
    ("import os\nos.environ['RAY_prestart_worker_first_driver'] = '1'", True),
    ("cmd = ['--num_prestart_python_workers=1']", True),
    ("import torch\nsetattr(torch._dynamo.config, 'cache_size_limit', 64)", False),
    ("import torch\ntorch._dynamo.config.cache_size_limit = 64", False),
    ("import ray\nray.init(address='auto')\nx = ray.cluster_resources()", False),
    ("import os\nos.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')", False),
    ("from ray import tune\nconfig = tune.RunConfig(name='x')\nconfig.name = 'y'", False),
    ("import mlflow\nclient = mlflow.MlflowClient()\nclient.x = 1", False),
])
def test_the_dependency_check_catches_what_it_should(source, caught):
    assert bool(dependency_misuse(source)) is caught, dependency_misuse(source)
