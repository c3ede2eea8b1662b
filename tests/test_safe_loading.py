"""Nothing the project reads can run code: YAML through a SafeLoader only, checkpoints
with ``torch.load(weights_only=True)``, no pickle, no eval/exec. An AST scan of service/
and a search space that tries to run a command."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.errors import UserError
from service.yamlio import MAX_BYTES, BoundedSafeLoader, load_yaml

SERVICE = Path(__file__).resolve().parents[1] / "service"
SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "BoundedSafeLoader"}


def _name(node: ast.AST) -> str:
    """``yaml.load`` for ``yaml.load(...)``'s func, ``torch.load`` etc."""
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "?"


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _problems(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            for bad in ("pickle", "cloudpickle", "dill", "marshal", "shelve"):
                if any(n and (n == bad or n.startswith(bad + ".")) for n in names):
                    out.append(f"line {node.lineno}: imports {bad}")
        if not isinstance(node, ast.Call):
            continue
        func = _name(node.func)
        tail = func.rsplit(".", 1)[-1]
        where = f"line {node.lineno}: {func}("
        if func in ("eval", "exec", "compile", "__import__"):
            out.append(where + " runs code")
        elif func.startswith("yaml.") and tail in ("unsafe_load", "unsafe_load_all", "full_load", "full_load_all"):
            out.append(where + " is not a safe loader")
        elif func in ("yaml.load", "yaml.load_all"):
            loader = _kw(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            if loader is None or _name(loader).rsplit(".", 1)[-1] not in SAFE_LOADERS:
                out.append(where + " without a SafeLoader")
        elif tail in ("loads", "load") and func.split(".")[0] in ("pickle", "cloudpickle", "dill", "marshal"):
            out.append(where + " unpickles")
        elif func == "torch.load":
            weights_only = _kw(node, "weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                out.append(where + " without weights_only=True")
    return out


def test_the_scan_finds_what_it_looks_for():
    bad = ("import pickle\nyaml.load(s)\nyaml.load(s, Loader=yaml.Loader)\nyaml.unsafe_load(s)\n"
           "torch.load(p)\ntorch.load(p, weights_only=False)\neval('1')\nexec('x')\ncloudpickle.loads(b)\n")
    assert len(_problems(ast.parse(bad))) == 9
    good = "yaml.load(s, Loader=BoundedSafeLoader)\nyaml.safe_load(s)\ntorch.load(p, weights_only=True)\n"
    assert _problems(ast.parse(good)) == []


def test_service_never_loads_code():
    found = {}
    for path in sorted(SERVICE.rglob("*.py")):
        problems = _problems(ast.parse(path.read_text(), filename=str(path)))
        if problems:
            found[str(path.relative_to(SERVICE.parent))] = problems
    assert not found, found
    assert issubclass(BoundedSafeLoader, __import__("yaml").SafeLoader)


PAYLOADS = [
    "name: x\ntask: !!python/object/apply:os.system ['touch pwned']\nsteps: 10\n",
    "!!python/object/apply:os.system ['touch pwned']\n",
    "name: !!python/name:os.system x\n",
    "a: !!python/object/new:subprocess.Popen [['touch', 'pwned']]\n",
    "a: !!python/module:os\n",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_python_tag_in_a_search_space_is_refused(tmp_path, payload):
    space = tmp_path / "space.yaml"
    space.write_text(payload)
    result = CliRunner().invoke(app, ["sweep", str(space)])
    assert result.exit_code == 2, result.output
    assert f"{space}: not valid YAML" in result.output and "could not determine a constructor" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml"]


def test_a_python_tag_in_a_run_config_is_refused(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(PAYLOADS[0])
    result = CliRunner().invoke(app, ["run", str(config)])
    assert result.exit_code == 2 and "not valid YAML" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("text, expected", [
    ("a: &a [*a]\n", "recursive aliases are not allowed"),
    ("l0: &l0 [x, x]\n" + "".join(f"l{i + 1}: &l{i + 1} [{', '.join([f'*l{i}'] * 10)}]\n" for i in range(7)),
     "once aliases are expanded"),
    ("[" * 200 + "]" * 200, "nested more than"),
    ("when: 2024-13-45\n", "a value cannot be read"),
])
def test_yaml_bombs_are_refused(tmp_path, text, expected):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=expected) as err:
        load_yaml(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_oversized_and_non_utf8_files_are_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * MAX_BYTES + b"\n")
    with pytest.raises(UserError, match="larger than 1,000,000 bytes"):
        load_yaml(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin.yaml: not UTF-8 text \(invalid continuation byte at byte 9\)"):
        load_yaml(latin)
