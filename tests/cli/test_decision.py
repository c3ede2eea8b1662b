"""From launch to decision (issue 14): `sweep --validate K` ends with a verdict, the winner
exports as a run config that `run` trains as is, the parent run carries the answer, and
the printed MLflow links open the runs table (in a browser: tests/cli/test_answers.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.formatting import settings_label
from service.scoring.metrics import wilson_interval
from service.scoring.verdict import PROMISING_LOW, verdict
from service.tracking import runs, store
from service.tracking.links import CLASSIC_KIND, TAG_EXPERIMENT_KIND, runs_table_url, ui_base

REPO = Path(__file__).resolve().parents[2]
SMOKE = str(REPO / "search_spaces" / "smoke.yaml")
runner = CliRunner()


# -- quick ---------------------------------------------------------------------------------------------
def test_verdict_thresholds():
    assert verdict(0.8, True).key == "robust" and verdict(0.79, True).key == "promising"
    assert verdict(0.5, False).key == "promising" and verdict(0.49, False).key == "not_robust"
    assert verdict(None, True) is None
    assert "not yet validated" in verdict(0.9, False).sentence()


def test_links_open_the_runs_table():
    url = runs_table_url("http://127.0.0.1:5000", "7")
    assert url.startswith("http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning")
    assert "viewStateShareKey=nalu-sweep" in url  # the sort and columns of the experiment's shared view
    assert "orderByKey" not in url  # a sort in the URL would make the UI ignore the shared view
    assert ui_base("https://admin:secret@mlflow.example.org/") == ("https://mlflow.example.org", True)
    assert ui_base("sqlite:////tmp/x/mlflow.db") == ("http://127.0.0.1:5000", False)


def test_settings_label_depends_on_the_settings_only():
    assert settings_label({"lr": "0.0123456", "gate": "bias"}, ["lr", "gate"]) == "lr=0.0123 gate=bias"
    assert settings_label({}, []) == "(fixed settings)"
    assert len(settings_label({"x": "a" * 400})) == 250


# -- a real tiny sweep through the CLI, shared by the slow tests ----------------------------------------
@pytest.fixture(scope="module")
def decided(ray_address, tmp_path_factory):
    root = tmp_path_factory.mktemp("decision")
    uri = store.default_tracking_uri(root)
    here = os.getcwd()
    os.chdir(root)  # the report goes to ./reports/NAME
    try:
        result = runner.invoke(app, ["sweep", SMOKE, "--name", "dec", "--trials", "2", "--seeds", "2",
                                     "--steps", "500", "--eval-every", "250", "--tracking-uri", uri,
                                     "--storage-path", str(root / "runs"), "--validate", "2",
                                     "--validate-seeds", "3"])
    finally:
        os.chdir(here)
    assert result.exit_code == 0, result.output
    return root, uri, result.output


@pytest.mark.slow
def test_sweep_validate_ends_with_the_verdict_and_links(decided):
    root, uri, output = decided
    text = " ".join(output.split())  # rich wraps long lines
    assert "Verdict: not robust" in text, output  # three fresh seeds cannot prove more (below)
    for needle in ("search: ", "validation: ", "on fresh seeds", "report: ", "MLflow runs table: ",
                   "nalu-sweep best dec --format yaml"):
        assert needle in text, needle
    assert "#/experiments/" in text and "/runs?workflowType=machine_learning" in text
    # the answer first, the long table under it; commands and links whole, one line each
    assert output.index("Verdict:") < output.index("sweep dec: top"), output
    # both settings validated: what picking the better of them on their fresh seeds would cost
    assert "Of the 2 validated settings" in text and "widened for the choice among 2 (Bonferroni)" in text, output
    assert re.search(r"^reuse it: nalu-sweep best dec --format yaml > best\.yaml && nalu-sweep run best\.yaml$",
                     output, re.M), output
    assert re.search(r"^top settings in MLflow: http://\S+/#/compare-runs\?runs=\S+$", output, re.M), output
    summary = json.loads((root / "reports" / "dec" / "summary.json").read_text())
    assert summary["best"]["trial"].startswith("trial-") and summary["best"]["params"]
    assert summary["search"]["n"] == 2 and summary["validation"]["n"] == 3
    # no rung below the last report (grace 1000 steps > 500): both trials ran to the end
    assert summary["trials"]["completed"] == 2 and summary["trials"]["pruned"] == 0
    # the verdict is the validation's: 3 fresh seeds give a lower end of at most 0.44 (3 of 3)
    validation = summary["validation"]
    assert validation["ci_low"] == pytest.approx(wilson_interval(validation["successes"], 3)[0])
    assert wilson_interval(3, 3)[0] < PROMISING_LOW
    assert summary["verdict"] == {"key": "not_robust", "words": verdict(validation["ci_low"], True).words,
                                  "ci_low": validation["ci_low"], "validated": True}
    assert summary["summary"]  # the sentences are still there


@pytest.mark.slow
def test_mlflow_records_names_tags_and_the_answer(decided):
    _, uri, _ = decided
    client = store.client(uri)
    exp = client.get_experiment_by_name("dec")
    assert exp.tags[TAG_EXPERIMENT_KIND] == CLASSIC_KIND
    assert "success_ci_low" in exp.tags["mlflow.note.content"]
    parent = runs.find_sweep_run(client, exp.experiment_id, "dec")
    tags = parent.data.tags
    assert tags["nalu_sweep.verdict"] == "not_robust"
    assert tags["nalu_sweep.report"] == "report/report.html"
    shown = runner.invoke(app, ["best", "dec", "--tracking-uri", uri])
    assert shown.exit_code == 0 and "report in MLflow: " in shown.output and "MLflow runs table: " in shown.output
    assert "Verdict:" in tags["mlflow.note.content"] and "report/report.html" in tags["mlflow.note.content"]
    best_run = client.get_run(tags["nalu_sweep.best.run_id"])
    for name in ("lr", "optimizer", "lambda_max", "nau_init"):
        assert tags[f"nalu_sweep.best.{name}"] == best_run.data.params[name]
    trials = runs.trial_runs(client, exp.experiment_id, parent.info.run_id)
    for t in trials:  # named by their settings, not by a rank or an id
        assert t.info.run_name.startswith("lr=") and "optimizer=" in t.info.run_name, t.info.run_name
    vals = [r for r in runs.all_runs(client, [exp.experiment_id], "tags.`nalu_sweep.role` = 'validation'")]
    assert len(vals) == 2  # --validate 2: both settings, each named after the trial it re-runs
    assert sorted(v.info.run_name for v in vals) == sorted(f"validate: {t.info.run_name}" for t in trials)


def _digest(config) -> str:
    data = config.model_dump(mode="json", serialize_as_any=True)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@pytest.mark.slow
def test_best_exports_a_run_config_that_run_accepts(decided, tmp_path):
    from service.config import RunConfig
    from service.sweep.validation import trial_configs
    from service.tracking.queries import load_sweep, sweep_space
    from service.yamlio import load_mapping

    _, uri, _ = decided
    out = runner.invoke(app, ["best", "dec", "--format", "yaml", "--tracking-uri", uri])
    assert out.exit_code == 0, out.output
    path = tmp_path / "best.yaml"
    path.write_text(out.stdout)
    client = store.client(uri)
    view = load_sweep(client, "dec")
    best = view.ranked()[0]
    expected = trial_configs(sweep_space(client, view.run_id), best.params)["small_mul"]
    assert _digest(RunConfig.model_validate(load_mapping(path))) == _digest(expected)
    as_json = runner.invoke(app, ["best", "dec", "--format", "json", "--trial", view.trials[-1].name,
                                  "--tracking-uri", uri])
    other = trial_configs(sweep_space(client, view.run_id), view.trials[-1].params)["small_mul"]
    assert _digest(RunConfig.model_validate(json.loads(as_json.stdout))) == _digest(other)
    trained = runner.invoke(app, ["run", str(path), "--quiet", "--output", str(tmp_path / "r.json")])
    assert trained.exit_code == 0, trained.output
    assert "small_mul" in trained.output  # the sweep's task, not `run`'s default
    bad = runner.invoke(app, ["best", "dec", "--format", "xml", "--tracking-uri", uri])
    assert bad.exit_code == 2 and "--format" in bad.output


# the printed links in a real browser, on the cells a 1400-px window shows: tests/cli/test_answers.py


def test_a_sweep_of_several_tasks_exports_one_task_at_a_time(monkeypatch):
    from types import SimpleNamespace

    import service.tracking.queries as queries
    from service.cli import decision
    from service.errors import UserError
    from service.search.loading import load_space

    space = load_space(REPO / "search_spaces" / "nalu_gates.yaml")
    assert len(space.task_configs()) > 1
    monkeypatch.setattr(queries, "sweep_space", lambda client, run_id: space)
    monkeypatch.setattr(store, "client", lambda uri: None)
    params = {}
    for name, p in space.params.items():  # any valid value of each parameter, as MLflow logs it
        labels = getattr(p, "labels", None)
        params[name] = str(labels[0]) if labels else str(getattr(p, "low"))
    view = SimpleNamespace(name="gates", run_id="r")
    row = SimpleNamespace(params=params, name="trial-x", run_name="x")
    with pytest.raises(UserError, match="--task"):
        decision.trial_config_data("sqlite:///x", view, row, None)
    first = next(iter(space.task_configs()))
    task, data = decision.trial_config_data("sqlite:///x", view, row, first)
    assert task == first and data["task"]["kind"]
