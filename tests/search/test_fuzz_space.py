"""Bad input, generated: mutated search spaces and invalid flags never crash.

Documents are derived from the shipped ``search_spaces/*.yaml`` by hypothesis (type swaps,
unknown keys, deletions, negative and inverted ranges, empty choices, conditions on missing
parameters, huge numbers) and then, sometimes, damaged as bytes (non-UTF-8, random bytes,
truncation, Python tags). The loader either returns a valid space or raises
`SearchSpaceError`; the CLI exits with code 2 and one paragraph on stderr, without a
traceback, and writes nothing (no ``mlflow.db``, ``mlruns/`` or storage directory).

The number of inputs tried is printed (``-s``) and written to
``.pytest_cache/d/nalu_sweep/fuzz_counts.json``.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from service.cli import app
from service.search.loading import load_space
from service.search.space import SearchSpace, SearchSpaceError
from service.sweep import driver

REPO = Path(__file__).resolve().parents[2]
SPACES = sorted((REPO / "search_spaces").glob("*.yaml"))
BASES = [yaml.safe_load(p.read_text()) for p in SPACES]
SMOKE = str(REPO / "search_spaces" / "smoke.yaml")

FUZZ = settings(derandomize=True, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large])
MINIMUM = {"loader_documents": 300, "cli_files": 100, "cli_flags": 120}
COUNTS: dict[str, int] = {key: 0 for key in MINIMUM}
COUNTS.update(loader_valid=0, loader_rejected=0, cli_files_valid=0)

HUGE = st.sampled_from([10**9, 10**12, 2**63, -(2**63), 10**30, 10**400, -10**400, 1e308, -1e308])
ODD_FLOATS = st.sampled_from([float("inf"), float("-inf"), float("nan"), -0.0, 1e-320])
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), HUGE, ODD_FLOATS,
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.sampled_from(["U[2,1]", "U[nan,1]", "U[1e999,2]", "U[1,2] ∪ U[1.5,3]", "nope", "2001-01-01",
                     "nau", "*", "model.layers.9.unit", "", " ", "∪", "uniform(a,b)"]),
    st.builds(list), st.builds(dict), st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(-3, 3), max_size=2),
)


# -- document mutations --------------------------------------------------------------------------------
def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, prefix + (i,)))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def _type_swap(value: Any) -> Any:
    if isinstance(value, bool):
        return "yes" if value else [value]
    if isinstance(value, (int, float)):
        return str(value) + "x"
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        return list(value)
    return {"null": value}


def _mutate(data: st.DataObject, doc: Any) -> Any:
    """One structural mutation at a drawn place of the document."""
    op = data.draw(st.sampled_from(["replace", "delete", "unknown_key", "negate", "huge", "type_swap",
                                    "invert_range", "empty_choices", "dangling_when", "bad_target"]))
    params = doc.get("params") if isinstance(doc, dict) else None
    if op in ("invert_range", "empty_choices", "dangling_when", "bad_target") and isinstance(params, dict) and params:
        name = data.draw(st.sampled_from(sorted(params, key=str)))
        p = params[name]
        if not isinstance(p, dict):
            params[name] = {"type": "categorical", "choices": []}
        elif op == "invert_range":
            p["low"], p["high"] = p.get("high", 1), p.get("low", -1)
            if data.draw(st.booleans()):
                p["low"] = -abs(p["low"]) if isinstance(p["low"], (int, float)) else -1
        elif op == "empty_choices":
            p["type"] = "categorical"
            p["choices"] = copy.deepcopy(data.draw(st.sampled_from([[], {}, [[]], {"a": []}, [None], [1, 1]])))
        elif op == "dangling_when":
            p["when"] = {data.draw(st.sampled_from(["missing", name, "", "gate"])): data.draw(JUNK)}
        else:
            p["target"] = data.draw(st.sampled_from(["", "task.kind", "model..unit", "model.layers.99.unit",
                                                     "nowhere.x", "model.layers.x.unit", ("train.steps",)]))
            p["target"] = list(p["target"]) if isinstance(p["target"], tuple) else p["target"]
        return doc
    paths = _paths(doc)
    path = data.draw(st.sampled_from(paths))
    value = _get(doc, path)
    if op == "delete" and path:
        parent = _get(doc, path[:-1])
        del parent[path[-1]]
        return doc
    if op == "unknown_key":
        target = value if isinstance(value, dict) else doc if isinstance(doc, dict) else None
        if target is not None:
            target[data.draw(st.sampled_from(["bogus", "lr", "stepz", "params", "1", "type"]))] = data.draw(JUNK)
            return doc
    if op == "negate" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _set(doc, path, -value - 1)
    if op == "huge":
        return _set(doc, path, data.draw(HUGE))
    if op == "type_swap":
        return _set(doc, path, _type_swap(value))
    return _set(doc, path, data.draw(JUNK))


def _damage(data: st.DataObject, raw: bytes) -> bytes:
    """Sometimes break the bytes themselves."""
    how = data.draw(st.sampled_from(["none"] * 6 + ["latin1", "invalid_utf8", "truncate", "random_bytes",
                                                    "insert_bytes", "python_tag", "tab", "alias_bomb"]))
    if how == "latin1":
        return raw.replace(b"e", b"\xe9", 1)
    if how == "invalid_utf8":
        at = data.draw(st.integers(0, len(raw)))
        return raw[:at] + data.draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80"])) + raw[at:]
    if how == "truncate":
        return raw[:data.draw(st.integers(0, max(0, len(raw) - 1)))]
    if how == "random_bytes":
        return data.draw(st.binary(max_size=200))
    if how == "insert_bytes":
        at = data.draw(st.integers(0, len(raw)))
        return raw[:at] + data.draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    if how == "python_tag":
        return b"payload: !!python/object/apply:os.system ['touch pwned']\n" + raw
    if how == "tab":
        return raw.replace(b"  ", b"\t", 1)
    if how == "alias_bomb":
        levels = "".join(f"l{i + 1}: &l{i + 1} [{', '.join([f'*l{i}'] * 10)}]\n" for i in range(7))
        return b"l0: &l0 [lol, lol]\n" + levels.encode() + raw
    return raw


def documents(data: st.DataObject) -> bytes:
    doc = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _mutate(data, doc)
    raw = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).encode("utf-8")
    return _damage(data, raw)


# -- checks ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _report_counts(request):
    yield
    print(f"\nfuzz inputs tried: {json.dumps(COUNTS)}")
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        (Path(cache.mkdir("nalu_sweep")) / "fuzz_counts.json").write_text(json.dumps(COUNTS, indent=1))


def _written(cwd: Path, before: set[str]) -> set[str]:
    return set(os.listdir(cwd)) - before


def test_the_loader_accepts_or_explains_every_document(tmp_path):
    path = tmp_path / "space.yaml"

    @settings(FUZZ, max_examples=MINIMUM["loader_documents"])
    @given(st.data())
    def check(data):
        path.write_bytes(documents(data))
        COUNTS["loader_documents"] += 1
        try:
            space = load_space(path)
        except SearchSpaceError as e:
            COUNTS["loader_rejected"] += 1
            message = str(e)
            assert message.startswith(str(path)) and "Traceback" not in message
            assert "\n\n" not in message.strip()
        else:
            COUNTS["loader_valid"] += 1
            assert isinstance(space, SearchSpace)

    check()
    assert not (tmp_path / "pwned").exists()
    assert COUNTS["loader_documents"] >= MINIMUM["loader_documents"]


REACHED_SWEEP = "(fuzz) a valid input reached the sweep"


def _stub_sweep(space, options, console):  # nothing of a valid space is run here
    from service.errors import UserError

    raise UserError(REACHED_SWEEP)


def _assert_clean_failure(result, cwd: Path, before: set[str], args: list[str]) -> None:
    text = result.output
    assert result.exit_code == 2, f"{args}: exit {result.exit_code}\n{text}\n{result.exception!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), f"{args}: {result.exception!r}"
    assert "Traceback" not in text, text
    assert text.strip() and "\n\n" not in text.strip(), f"{args}: not one paragraph:\n{text}"
    assert not _written(cwd, before), f"{args}: wrote {_written(cwd, before)}"


def test_the_cli_rejects_invalid_space_files(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "run_sweep", _stub_sweep)
    path = tmp_path / "space.yaml"
    runner = CliRunner()

    @settings(FUZZ, max_examples=MINIMUM["cli_files"] + 20)
    @given(st.data())
    def check(data):
        path.write_bytes(documents(data))
        before = set(os.listdir(tmp_path))
        args = ["sweep", str(path), "--storage-path", str(tmp_path / "storage")]
        result = runner.invoke(app, args)
        if REACHED_SWEEP in result.output:
            COUNTS["cli_files_valid"] += 1  # a valid space: not this test's business
        else:
            COUNTS["cli_files"] += 1
        _assert_clean_failure(result, tmp_path, before, args)

    check()
    assert COUNTS["cli_files"] >= MINIMUM["cli_files"]


BAD_FLAGS = {
    "sweep": {
        "--trials": ["-3", "0", "abc", str(10**9), "1e3"],
        "--seeds": ["0", "-1", str(10**9), str(10**30), "1.5"],
        "--steps": ["0", "-100", str(10**15), "ten"],
        "--eval-every": ["0", "-1", str(10**12)],
        "--concurrency": ["0", "-2", str(10**8)],
        "--cpus-per-trial": ["0", "-1", "nan", "inf", "1e308"],
        "--gpus-per-trial": ["-1", "nan", "inf", "1e9"],
        "--name": ["a b", "../up", "", "x/y", "é"],
        "--address": ["127.0.0.1:1", "nonsense", "host:port", "ray://127.0.0.1:1", "127.0.0.1:99999",
                      "http://127.0.0.1:1"],
        "--tracking-uri": ["http://127.0.0.1:1", "bogus://x", "http://127.0.0.1:99999",
                           "postgresql://u:secret@127.0.0.1:1/db"],
        "--optuna-storage": ["postgresql://u:pw@127.0.0.1:1/optuna", "mysql://127.0.0.1:1/o"],
    },
    "run": {
        "--seeds": ["0", "-4", str(10**9), "x"],
        "--steps": ["0", "-1", str(10**15)],
        "--lr": ["0", "-1", "nan", "inf"],
        "--batch-size": ["0", str(10**12)],
        "--eval-every": ["0", str(10**12)],
        "--units": ["bogus", "nau,,nmu", "NAU", ""],
        "--task": ["nope", "ARITHMETIC"],
        "--operation": ["pow", "nope"],
        "--interpolation": ["U[2,1]", "U[nan,1]", "U[1,inf]", "garbage", "U[1e999,2e999]"],
        "--extrapolation": ["U[6,2]", "x=", "=U[1,2]", "interpolation=U[2,6]"],
        "--optimizer": ["adamw"],
        "--master-seed": [str(2**64), str(-(2**70))],
        "--seed-offset": ["-1", str(2**63)],
        "--device": ["tpu"],
        "--compile": ["maybe"],
    },
    "status": {"--tracking-uri": ["http://127.0.0.1:1", "bogus://x", "postgresql://127.0.0.1:1/db"]},
    "best": {"--tracking-uri": ["http://127.0.0.1:1", "bogus://x"], "--top": ["0", "-1"]},
    "report": {"--tracking-uri": ["http://127.0.0.1:1", "bogus://x"]},
    "validate": {"--tracking-uri": ["http://127.0.0.1:1"], "--seeds": ["0", "-1"], "--top": ["0"],
                 "--address": ["127.0.0.1:1", "nonsense"]},
    "compare": {"--tracking-uri": ["http://127.0.0.1:1", "bogus://x"], "--top": ["0"]},
    "ui": {"--port": ["0", "70000", "x"]},
}
POSITIONAL = {"sweep": [SMOKE], "run": [], "status": [], "best": ["s"], "report": ["s"], "validate": ["s"],
              "compare": ["a", "b"], "ui": []}


@st.composite
def flag_sets(draw) -> list[str]:
    verb = draw(st.sampled_from(sorted(BAD_FLAGS)))
    flags = draw(st.lists(st.sampled_from(sorted(BAD_FLAGS[verb])), min_size=1, max_size=3, unique=True))
    args = [verb, *POSITIONAL[verb]]
    for flag in flags:
        args += [flag, draw(st.sampled_from(BAD_FLAGS[verb][flag]))]
    return args


def test_the_cli_rejects_invalid_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "run_sweep", _stub_sweep)
    monkeypatch.setenv("NALU_SWEEP_CONNECT_TIMEOUT", "2")
    import service.cli.run as report_console

    def no_training(config, console, quiet=False):
        raise AssertionError(f"an invalid input reached training: {config}")

    monkeypatch.setattr(report_console, "run_with_progress", no_training)
    runner = CliRunner()

    @settings(FUZZ, max_examples=MINIMUM["cli_flags"])
    @given(flag_sets())
    def check(args):
        COUNTS["cli_flags"] += 1
        before = set(os.listdir(tmp_path))
        result = runner.invoke(app, args)
        assert REACHED_SWEEP not in result.output, f"{args}: accepted"
        _assert_clean_failure(result, tmp_path, before, args)

    check()
    assert COUNTS["cli_flags"] >= MINIMUM["cli_flags"]
