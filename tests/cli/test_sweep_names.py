"""One sweep-name rule for every verb and for the search-space loader.

The name becomes an MLflow experiment name and a directory, so the rule is strict ASCII.
The fuzzer in ``test_fuzz_space.py`` found ``--name é`` accepted by ``sweep`` while the
loader rejected it in a file; these fixed cases pin the rule whatever ``hypothesis``
release generates the fuzzer's examples.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from service.cli import app
from service.names import MAX_SWEEP_NAME, sweep_name_problem
from service.search.loading import load_space
from service.search.space import SearchSpaceError
from service.sweep import driver

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "search_spaces" / "smoke.yaml"
REACHED_SWEEP = "(names) a valid name reached the sweep"

TRICKY = {
    "unicode letter": "é",
    "unicode word": "süß-sweep",
    "non-ASCII digit": "٣",
    "fullwidth letter": "ａ",
    "leading dash": "-x",
    "only a dash": "-",
    "leading dot": ".hidden",
    "dot dot": "..",
    "empty": "",
    "space": "a b",
    "only whitespace": "   ",
    "trailing newline": "name\n",
    "tab": "a\tb",
    "slash": "x/y",
    "parent directory": "../up",
    "backslash": "a\\b",
    "colon": "a:b",
    "too long": "a" * (MAX_SWEEP_NAME + 1),
}
VALID = ["smoke", "nalu-gates_2", "v1.0", "0day", "A", "a" * MAX_SWEEP_NAME]


def _stub_sweep(space, options, console):
    from service.errors import UserError

    raise UserError(REACHED_SWEEP)


@pytest.mark.parametrize("name", TRICKY.values(), ids=TRICKY.keys())
def test_the_rule_rejects_tricky_names(name):
    assert sweep_name_problem(name) is not None


@pytest.mark.parametrize("name", VALID)
def test_the_rule_accepts_plain_names(name):
    assert sweep_name_problem(name) is None


def test_the_fuzzers_failing_input_is_rejected(tmp_path, monkeypatch):
    """Regression: ``sweep search_spaces/smoke.yaml --name é`` was accepted (hypothesis
    6.170.15, derandomized)."""
    monkeypatch.setattr(driver, "run_sweep", _stub_sweep)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["sweep", str(SMOKE), "--name", "é"])
    assert result.exit_code == 2, result.output
    assert REACHED_SWEEP not in result.output
    assert "ASCII letters" in result.output
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", TRICKY.values(), ids=TRICKY.keys())
def test_sweep_rejects_a_tricky_name_flag(tmp_path, monkeypatch, name):
    monkeypatch.setattr(driver, "run_sweep", _stub_sweep)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["sweep", str(SMOKE), "--name", name])
    assert result.exit_code == 2, result.output
    assert REACHED_SWEEP not in result.output
    assert "Traceback" not in result.output
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", TRICKY.values(), ids=TRICKY.keys())
def test_the_loader_rejects_a_tricky_name_in_the_file(tmp_path, name):
    doc = yaml.safe_load(SMOKE.read_text())
    doc["name"] = name
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    with pytest.raises(SearchSpaceError, match="name"):
        load_space(path)


def test_sweep_accepts_a_plain_name_flag(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "run_sweep", _stub_sweep)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["sweep", str(SMOKE), "--name", "nalu-gates_2"])
    assert REACHED_SWEEP in result.output, result.output


@pytest.mark.parametrize("args", [["status", "é"], ["best", "a:b"], ["report", "../up"],
                                  ["validate", "a b"], ["compare", "ok", "x/y"]],
                         ids=["status", "best", "report", "validate", "compare"])
def test_every_verb_applies_the_rule(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "ASCII letters" in result.output, result.output
    assert os.listdir(tmp_path) == []
