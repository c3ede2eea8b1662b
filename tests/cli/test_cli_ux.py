"""What a user reads in a terminal: one error style, the existing sweeps (and the closest
one) named by every verb that reads a sweep, nothing printed before an error, and `best`
and `compare` readable at 80 and 100 columns, with no value cut short."""

from __future__ import annotations

import importlib

import pytest
from rich.console import Console
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()




@pytest.mark.parametrize("args", [["status", "bnech"], ["best", "bnech"], ["report", "bnech"],
                                  ["validate", "bnech"], ["compare", "bench", "bnech"],
                                  ["compare", "bnech", "other"]], ids=lambda a: " ".join(a))
def test_an_unknown_sweep_names_the_existing_ones(bench_store, monkeypatch, args):
    monkeypatch.chdir(bench_store)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output  # nothing before the error ("validating the top…")
    assert lines[0].startswith("error: no sweep named 'bnech' in sqlite:///"), result.output
    assert "did you mean 'bench'? sweeps: bench, other" in lines[0], result.output


def test_compare_refuses_the_same_sweep_twice(bench_store, monkeypatch):
    monkeypatch.chdir(bench_store)
    result = runner.invoke(app, ["compare", "bench", "bench"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == ("error: compare needs two different sweeps, not 'bench' twice; "
                                     "one sweep's best settings: nalu-sweep best bench"), result.output


@pytest.mark.parametrize("args,expected", [
    (["best"], "error: Missing argument 'name'. See `nalu-sweep best --help`."),
    (["best", "x", "--top", "0"], "error: Invalid value for '--top'"),
    (["nope"], "error: No such command 'nope'. See `nalu-sweep --help`."),
], ids=["missing-argument", "bad-option", "unknown-command"])
def test_command_line_mistakes_read_like_every_other_error(args, expected):
    result = runner.invoke(app, args, prog_name="nalu-sweep")
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith(expected), result.output
    assert "╭" not in result.output and "Error ─" not in result.output  # no rich box


def _at_width(monkeypatch, width: int, args: list[str]) -> str:
    """The verb's output as a terminal of ``width`` columns shows it."""
    module = importlib.import_module("service.cli.app")
    term = Console(width=width, force_terminal=True, color_system=None, record=True)
    for name in ("service.cli.app", "service.cli.sweep", "service.cli.analysis", "service.cli.common"):
        monkeypatch.setattr(importlib.import_module(name), "console", term)
    assert module.console is term
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return term.export_text()


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("args", [["status"], ["status", "bench"]], ids=lambda a: " ".join(a))
def test_status_fits_a_narrow_terminal(bench_store, monkeypatch, width, args):
    monkeypatch.chdir(bench_store)
    text = _at_width(monkeypatch, width, args)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text, text
    assert "4/4 [0.51, 1.00]" in text and "finished/planned" in text


@pytest.mark.parametrize("width", [80, 100])
def test_best_fits_a_narrow_terminal(bench_store, monkeypatch, width):
    monkeypatch.chdir(bench_store)
    text = _at_width(monkeypatch, width, ["best", "bench"])
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text, text  # no value cut short
    assert "most robust setting of bench" in text  # the winner, one line per item
    assert "optimizer" in text and "success [95% CI]" in text


def test_best_ranks_the_most_robust_first(bench_store, monkeypatch):
    """The winner and the ranking's first row are the completed trial of the highest
    objective, and the rows follow the objective down, as MLflow itself records them."""
    import re

    from mlflow.tracking import MlflowClient

    from service.tracking import store

    monkeypatch.chdir(bench_store)
    client = MlflowClient(store.default_tracking_uri(bench_store))
    experiment = client.get_experiment_by_name("bench")
    completed = client.search_runs([experiment.experiment_id],
                                   f"tags.`{store.TAG_ROLE}` = '{store.ROLE_TRIAL}' AND "
                                   f"tags.`{store.TAG_OUTCOME}` = 'completed'")
    by_objective = sorted(completed, key=lambda r: r.data.metrics["objective"], reverse=True)
    expected = ["trial-" + r.data.tags[store.TAG_TRIAL_KEY] for r in by_objective]
    assert len(expected) >= 3 and len({r.data.metrics["objective"] for r in completed}) == len(expected)

    result = runner.invoke(app, ["best", "bench"])
    assert result.exit_code == 0, result.output
    assert f"most robust setting of bench: {expected[0]}" in result.output, result.output
    shown = re.findall(r"^│ *(\d+) *│ *(trial-\S+) *│", result.output, re.M)
    assert shown == [(str(i), name) for i, name in enumerate(expected, 1)], result.output

def test_best_drops_a_column_no_row_has_a_value_in(bench_store, monkeypatch):
    from service.cli.tables import best_table
    from service.tracking.queries import load_sweep
    from service.tracking.store import client, default_tracking_uri

    view = load_sweep(client(default_tracking_uri(bench_store)), "bench")
    non_sgd = [t for t in view.ranked() if t.params.get("optimizer") != "sgd"]
    assert non_sgd, "the store needs a trial without momentum"
    view.trials = non_sgd
    headers = [c.header for c in best_table(view, top=10).columns]
    assert "momentum" not in headers and "optimizer" in headers


@pytest.mark.parametrize("width", [80, 100])
def test_compare_fits_a_narrow_terminal(bench_store, monkeypatch, width):
    monkeypatch.chdir(bench_store)
    text = _at_width(monkeypatch, width, ["compare", "bench", "other"])
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text, text
    assert "validation [95% CI]" not in text  # no sweep was validated: the column is left out


def test_report_shows_no_download_progress_bars(bench_store, monkeypatch, tmp_path):
    """MLflow draws a bar per downloaded artifact (the sweep's spec…): not in our output."""
    monkeypatch.chdir(bench_store)
    result = runner.invoke(app, ["report", "bench", "--no-log", "--output", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "Downloading artifacts" not in result.output and "%|" not in result.output, result.output
    assert "report:" in result.output
