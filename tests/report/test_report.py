"""`nalu-sweep report / validate / compare`: a real tiny sweep (Ray, Optuna, MLflow) is
validated on fresh seeds and its report rendered in headless Chromium; a recorded sweep
with diverged, pruned and failed trials still renders and says so."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from service.cli import app
from service.errors import UserError
from service.formatting import fmt_interval
from service.report.build import build_report, load_dashboard
from service.scoring.metrics import wilson_interval
from service.search.loading import load_space, parse_space, with_overrides
from service.sweep.validation import (
    fresh_offset,
    parse_ranges,
    used_seed_ids,
    validate_sweep,
)
from service.tracking import runs, store
from service.tracking.queries import validation_runs
from service.tracking.store import ROLE_VALIDATION, TAG_SEED_IDS

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SMOKE = REPO / "search_spaces" / "smoke.yaml"
_spec = importlib.util.spec_from_file_location("report_browser", HERE / "browser.py")
browser = importlib.util.module_from_spec(_spec)
sys.modules["report_browser"] = browser
_spec.loader.exec_module(browser)
runner = CliRunner()


def render_in_browser(html: Path, screenshot: Path) -> dict:
    """Load the page in headless Chromium: JavaScript errors, panels and their plot
    elements, the summary text; save a screenshot."""
    binary = browser.chromium()
    if binary is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    page = browser.Page(binary, screenshot.parent / "chromium-profile")
    try:
        page.load(html.resolve().as_uri())
        panels = page.evaluate(
            "Array.from(document.querySelectorAll('.panel')).map(d => "
            "[d.id, d.querySelectorAll('.plot .main-svg').length, d.querySelectorAll('.plot .plotly').length])")
        summary = page.evaluate("document.getElementById('summary').innerText")
        external = page.evaluate("Array.from(document.querySelectorAll('script[src],link[href]')).length")
        page.screenshot(screenshot)
        requests = [e["params"]["request"]["url"] for e in page.events if e["method"] == "Network.requestWillBeSent"]
        external += sum(1 for url in requests if not url.startswith(("file:", "data:", "blob:", "about:")))
        return {"errors": page.errors(), "panels": panels, "summary": summary, "external": external}
    finally:
        page.close()


def static_panels() -> list:
    """The dashboard's panels a sweep of a static task shows, not raced (no test-length or
    race panel)."""
    return [p for p in load_dashboard().panels if p.kind not in ("success_vs_length", "race")]


def check_page(page: dict, n_panels: int) -> None:
    assert page["errors"] == [], page["errors"]
    assert len(page["panels"]) == n_panels
    for panel_id, svgs, plots in page["panels"]:
        assert svgs >= 1 and plots >= 1, f"{panel_id} has no plot"
    assert page["external"] == 0  # nothing loaded from elsewhere: works offline


# -- a real tiny sweep, shared by the slow tests -----------------------------------------------------------
@pytest.fixture(scope="module")
def sweep(ray_address, tmp_path_factory):
    from service.sweep.driver import SweepOptions, run_sweep

    root = tmp_path_factory.mktemp("report-sweep")
    uri = store.default_tracking_uri(root)
    space = with_overrides(load_space(SMOKE), "test", trials=3, seeds=3, steps=1000, eval_every=250)
    summary = run_sweep(space, SweepOptions(name="rep", tracking_uri=uri, storage_path=str(root / "runs"),
                                            space_file=SMOKE))
    assert summary.outcome == "completed"
    return uri


@pytest.fixture(scope="module")
def validated(sweep):
    results = validate_sweep(sweep, "rep", top=2, seeds=3, extra_ranges={"far": "U[6,10]"})
    return sweep, results


def _seed_ids(client, run_id: str) -> set[int]:
    path = client.download_artifacts(run_id, "seeds.csv")
    with open(path, newline="") as f:
        return {int(row["seed"]) for row in csv.DictReader(f)}


@pytest.mark.slow
def test_validate_uses_fresh_seeds_under_the_same_parent(validated):
    uri, results = validated
    client = store.client(uri)
    exp = client.get_experiment_by_name("rep")
    parent = runs.find_sweep_run(client, exp.experiment_id, "rep")
    trials = runs.trial_runs(client, exp.experiment_id, parent.info.run_id)
    search_seeds = set().union(*(_seed_ids(client, t.info.run_id) for t in trials))
    assert search_seeds == {0, 1, 2}
    vals = validation_runs(client, exp.experiment_id, parent.info.run_id)
    assert len(vals) == len(results) == 2
    for run in vals:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags[store.TAG_ROLE] == ROLE_VALIDATION and run.info.status == "FINISHED"
        seeds = _seed_ids(client, run.info.run_id)
        assert len(seeds) == 3 and not seeds & search_seeds
        assert {"success_ci_low", "extrapolation_mse_median.extrapolation",
                "extrapolation_mse_median.far"} <= set(run.data.metrics)
    # validation runs are not trials: status/best still count 3 trials
    status = runner.invoke(app, ["status", "rep", "--tracking-uri", uri])
    assert status.exit_code == 0 and "3/3" in status.output, status.output
    # a second validation never reuses the first one's seeds either
    again = validate_sweep(uri, "rep", top=1, seeds=2, extra_ranges={"far": "U[6,10]"})
    assert not set(again[0].seed_ids) & (search_seeds | set(results[0].seed_ids))
    # so the best setting's two validations (3, then 2 fresh seeds, the same ranges) are one
    # sample of 5 seeds
    assert again[0].source_run_id == results[0].source_run_id
    k = int(results[0].metrics["successes"] + again[0].metrics["successes"])
    pooled = f"{k}/5 [{fmt_interval(*wilson_interval(k, 5))}] (3 + 2 seeds)"
    for verb in ("status", "best"):
        shown = runner.invoke(app, [verb, "rep", "--tracking-uri", uri], env={"COLUMNS": "250"})
        assert shown.exit_code == 0 and pooled in shown.output, shown.output


@pytest.mark.slow
def test_report_renders_offline_in_a_real_browser(validated, tmp_path):
    uri, _ = validated
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", "rep", "--output", str(out), "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert "<script src" not in html and "<link " not in html  # plotly.js is embedded
    panels = static_panels()
    assert {p.name for p in out.glob("*.png")} == {f"{p.id}.png" for p in panels}
    client = store.client(uri)
    parent = runs.find_sweep_run(client, client.get_experiment_by_name("rep").experiment_id, "rep")
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.html", "report/ranking.png", "report/summary.json"} <= logged

    page = render_in_browser(out / "report.html", tmp_path / "report.png")
    check_page(page, len(panels))
    assert "The most robust setting found is" in page["summary"]
    assert "fresh seeds" in page["summary"] and "never used in the search" in page["summary"]
    # two settings validated: the summary says what picking the better of them on its fresh seeds costs
    assert "Of the 2 validated settings" in page["summary"], page["summary"]
    assert "widened for the choice among 2 (Bonferroni)" in page["summary"]
    assert '"far"' in html  # the extra validation range is plotted
    assert "validation (fresh seeds)" in html  # search and validation side by side
    assert (tmp_path / "report.png").stat().st_size > 10_000
    print(f"screenshot: {tmp_path / 'report.png'}")


# -- a recorded sweep with diverged, pruned and failed trials (no training) ---------------------------------
def _fake_sweep(uri: str, name: str) -> str:
    client = store.client(uri)
    exp_id = store.ensure_experiment(client, name, uri)
    space = parse_space(yaml.safe_load(SMOKE.read_text()), source="smoke")
    parent = runs.start_sweep_run(client, exp_id, name, space_file=None,
                                  spec_json=json.dumps(space.model_dump(mode="json")), spec_hash="x",
                                  storage_path="/nowhere", params={"trials": 4, "searched": ", ".join(space.params)})
    rows = [
        ("completed", {"lr": 0.1, "optimizer": "adam", "lambda_max": 0.1, "nau_init": "default"},
         {"successes": 3, "n_seeds": 4, "success_rate": 0.75, "success_ci_low": 0.3, "success_ci_high": 0.95,
          "objective": 0.3, "diverged": 0, "solved_at_median": 750, "extrapolation_mse_median.extrapolation": 1e-3}),
        ("completed", {"lr": 0.29, "optimizer": "sgd", "momentum": 0.9, "lambda_max": 0.5, "nau_init": "default"},
         {"successes": 0, "n_seeds": 4, "success_rate": 0.0, "success_ci_low": 0.0, "success_ci_high": 0.49,
          "objective": 0.0, "diverged": 3}),
        ("pruned", {"lr": 0.02, "optimizer": "rmsprop", "lambda_max": 0.02, "nau_init": "xavier_uniform"},
         {"successes": 1, "n_seeds": 4, "success_rate": 0.25, "success_ci_low": 0.05, "success_ci_high": 0.7,
          "objective": 0.05, "diverged": 0, "extrapolation_mse_median.extrapolation": 2.0}),
        ("failed", {"lr": 0.05, "optimizer": "adam", "lambda_max": 0.03, "nau_init": "default"}, {}),
    ]
    for i, (outcome, params, metrics) in enumerate(rows):
        trial = runs.TrialRun.open(uri, exp_id, parent, trial_key=f"t{i}", run_name=f"trial-{i}",
                                   params=params, tags={store.TAG_SWEEP: name})
        trial.log_metrics(metrics, 1000)
        trial.close(outcome)
    runs.finish_sweep_run(client, parent, "completed")
    return parent


def test_report_of_a_sweep_with_diverged_and_pruned_trials(tmp_path):
    uri = store.default_tracking_uri(tmp_path)
    _fake_sweep(uri, "rough")
    files = build_report(uri, "rough", tmp_path / "out")
    text = " ".join(__import__("service.report.build", fromlist=["x"]).summary_lines(files.data))
    assert "1 pruned" in text and "1 failed" in text
    assert "diverged seeds" in text and "3 seeds" in text
    assert "not been validated on fresh seeds" in text
    page = render_in_browser(files.html, tmp_path / "rough.png")
    check_page(page, len(static_panels()))
    assert "pruned" in page["summary"] and "diverged" in page["summary"]


def test_compare_two_sweeps(tmp_path):
    uri = store.default_tracking_uri(tmp_path)
    _fake_sweep(uri, "one")
    _fake_sweep(uri, "two")
    result = runner.invoke(app, ["compare", "one", "two", "--top", "2", "--tracking-uri", uri])
    assert result.exit_code == 0, result.output
    assert "one" in result.output and "two" in result.output and "3/4 [0.30, 0.95]" in result.output
    missing = runner.invoke(app, ["compare", "one", "nope", "--tracking-uri", uri])
    assert missing.exit_code == 2 and "no sweep named 'nope'" in missing.output
    unknown = runner.invoke(app, ["report", "unknown", "--tracking-uri", uri])
    assert unknown.exit_code == 2 and "no sweep named 'unknown'" in unknown.output


def test_the_panels_read_like_the_terminal(tmp_path):
    """New panels (history, parallel coordinates) and the details: the objective to 4
    decimals, integer steps, the threshold and near misses on the MSE chart, values on the
    weights, an importance warning with few trials, no legend of one value."""
    from service.report.data import load_report_data
    from service.report.panels import PANEL_KINDS, metric_cell

    uri = store.default_tracking_uri(tmp_path)
    _fake_sweep(uri, "details")
    data = load_report_data(uri, "details")
    panel = lambda kind, **options: PANEL_KINDS[kind](data, options)  # noqa: E731

    assert metric_cell({"objective": 1.99e-11}, "objective") == "0.0000"
    assert metric_cell({"solved_at_median": 1500.0}, "solved_at_median") == "1500"
    ranking = panel("ranking_forest").table
    col = ranking[0].index("objective")
    assert [row[col] for row in ranking[1:]] == ["0.3000", "0.0000"]

    history = panel("optimization_history").figure
    best = next(t for t in history.data if t.name.startswith("best so far"))
    assert list(best.y) == sorted(best.y) and best.y[-1] == 0.3  # never goes down
    assert {t.name for t in history.data} >= {"completed", "pruned"}

    parallel = panel("parallel_coordinates")
    (trace,) = parallel.figure.data
    labels = [d.label for d in trace.dimensions]
    assert labels[-1] == "objective" and "lr (log10)" in labels and "optimizer" in labels
    assert "momentum" not in labels and "momentum" in parallel.note  # conditional: said, not drawn

    assert "Unreliable: only 3 finished trials" in panel("importance", min_trials=20).note
    assert "Unreliable" not in panel("importance", min_trials=2).note

    params = panel("success_vs_params")
    assert not any(t.showlegend for t in params.figure.data)  # one unit for every trial: no legend
    assert "every trial has unit=nau → nmu" in params.note

    best_run = data.ranked(1)[0].run_id
    data.seeds[best_run] = [{"seed": "0", "threshold.extrapolation": "0.000854"}]
    data.view.trials[0].metrics["extrapolation_mse_median.extrapolation"] = 0.000854 * 1.17
    mse = panel("extrapolation_mse").figure
    threshold = next(t for t in mse.data if t.name == "success threshold")
    assert list(threshold.y) == [0.000854]
    assert "×1.17" in list(mse.data[0].text)

    data.weights = {
        "best": {"seed": 3, "success": True, "diverged": False, "weights": {"W": [[1.0, 0.0], [0.0, 1.0]]}},
        "failed": {"seed": 7, "success": False, "diverged": False, "thresholds": {"extrapolation": 0.000854},
                   "extrapolation_mse": {"extrapolation": 0.000854 * 1.17},
                   "weights": {"W": [[0.93, 0.1], [0.0, 1.02]]}}}
    heat = panel("weights").figure
    titles = [a.text for a in heat.layout.annotations]
    assert any("failed: MSE ×1.17 the threshold" in t for t in titles), titles
    assert heat.data[1].text[0][0] == "0.93" and heat.data[0].texttemplate == "%{text}"


# -- a trial of several tasks (real training, no Ray) ---------------------------------------------------------
def test_the_weights_panel_shows_a_trial_of_several_tasks(tmp_path, monkeypatch):
    """Each task's artifacts are in a folder of its own: the report finds them there."""
    from service.report.data import load_report_data
    from service.report.panels import weights as weights_panel
    from service.sweep.trial import run_trial

    monkeypatch.setenv("NALU_SWEEP_SPOOL_DIR", str(tmp_path / "spool"))
    small = {"eval_samples": 200, "threshold_samples": 10_000}
    space = parse_space({
        "name": "two", "steps": 200, "eval_every": 100, "seeds": 4,
        "tasks": {"mul": {"kind": "small_mul", **small},
                  "add": {"kind": "arithmetic", "operation": "add", "input_size": 10, **small}},
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
                  "train": {"batch_size": 32}},
        "params": {"lr": {"type": "loguniform", "low": 1e-2, "high": 1e-1, "target": "train.optimizer.lr"}},
    })
    uri = store.default_tracking_uri(tmp_path)
    client = store.client(uri)
    exp_id = store.ensure_experiment(client, "two", uri)
    parent = runs.start_sweep_run(client, exp_id, "two", space_file=None, spec_json=space.spec_json(),
                                  spec_hash=space.spec_hash(), storage_path="/nowhere", params={})
    tracker = runs.TrialRun.open(uri, exp_id, parent, trial_key="t0", run_name="trial-0",
                                 params={"lr": 0.05}, tags={store.TAG_SWEEP: "two"})
    assert run_trial({"lr": 0.05}, space, lambda metrics: None, tracker).completed
    runs.finish_sweep_run(client, parent, "completed")

    data = load_report_data(uri, "two")
    assert data is not None and len(data.view.trials) == 1
    assert set(data.weights) >= {"best"}, "the weights of a several-task trial were not found"
    assert data.weights_source.endswith(("task add", "task mul"))
    assert data.seeds, "the per-seed table of a several-task trial was not found"
    panel = weights_panel(data, {})
    assert len(panel.figure.data) >= 2  # one heatmap per layer at least, not the empty placeholder


# -- pieces --------------------------------------------------------------------------------------------------
def test_fresh_seeds_are_disjoint_from_every_seed_the_search_used():
    space = load_space(SMOKE)
    params = [{"lr": "0.1", "optimizer": "adam", "lambda_max": "0.1", "nau_init": "default", "seeds": "4"}]
    used = used_seed_ids(space, params, [])
    assert used == {0, 1, 2, 3}
    earlier = [type("R", (), {"data": type("D", (), {"tags": {TAG_SEED_IDS: "4-35"}})()})()]
    used = used_seed_ids(space, params, earlier)
    assert fresh_offset(used) == 36


def test_extra_ranges_are_checked():
    assert parse_ranges(["far=U[6,20]"]) == {"far": "U[6,20]"}
    for bad in ("far", "=U[1,2]", "far=nonsense"):
        with pytest.raises(UserError):
            parse_ranges([bad])


def test_dashboard_panels_come_from_the_definitions_file(tmp_path):
    from service.report.panels import PANEL_KINDS

    board = load_dashboard()
    assert [p.kind for p in board.panels] == ["ranking_forest", "race", "optimization_history", "parallel_coordinates",
                                              "importance", "success_vs_params", "extrapolation_mse",
                                              "success_vs_length", "solved_at", "weights"]
    assert all(p.kind in PANEL_KINDS for p in board.panels)
    bad = tmp_path / "bad.yaml"
    bad.write_text("panels: [{kind: nope}]\n")
    with pytest.raises(UserError, match="unknown panel kind 'nope'"):
        load_dashboard(bad)


def test_system_metrics_are_recorded_on_a_run(tmp_path):
    import time

    from service.tracking.system_metrics import available, system_metrics

    if not available():
        pytest.skip("psutil is not installed")
    uri = store.default_tracking_uri(tmp_path)
    client = store.client(uri)
    exp_id = store.ensure_experiment(client, "sysm", uri)
    run_id = client.create_run(exp_id).info.run_id
    with system_metrics(run_id, uri, interval_s=0.5) as on:
        time.sleep(2.5)
    assert on
    keys = set(client.get_run(run_id).data.metrics)
    assert any(k.startswith("system/cpu") for k in keys), keys
