"""A file with nothing in it (0 bytes, or only blank lines and comments) is refused by every
verb that reads one, with one ``error:`` paragraph and exit 2 before anything is written:
`run` once trained its defaults for 44 s on an empty run config that `sweep` refused."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()

EMPTY = {"0-bytes": "", "blank-lines": "\n   \n\n", "comments-only": "# settings to come\n\n  # later\n"}


def _refused(args: list[str], cwd, before: set[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output  # one paragraph, nothing printed before it
    assert lines[0].startswith("error: ") and "empty.yaml: the file is empty" in lines[0], result.output
    assert {p.name for p in cwd.iterdir()} == before  # nothing written


@pytest.mark.parametrize("text", EMPTY.values(), ids=EMPTY.keys())
@pytest.mark.parametrize("verb", ["run", "sweep"])
def test_run_and_sweep_refuse_an_empty_file(tmp_path, monkeypatch, verb, text):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text(text)
    _refused([verb, "empty.yaml"], tmp_path, {"empty.yaml"})


@pytest.mark.parametrize("text", EMPTY.values(), ids=EMPTY.keys())
def test_report_refuses_an_empty_dashboard(bench_store, tmp_path, monkeypatch, text):
    shutil.copy(bench_store / "mlflow.db", tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text(text)
    _refused(["report", "bench", "--no-log", "--dashboard", "empty.yaml"], tmp_path, {"mlflow.db", "empty.yaml"})
