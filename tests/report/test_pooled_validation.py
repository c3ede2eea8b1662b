"""Validations of one setting on disjoint fresh seeds are one body of evidence: `status`,
`best`, `compare`, the report and the compare link show them pooled (32/32 then 5/8 is
37/40), with how many seeds each validation gave."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

from typer.testing import CliRunner

from service.cli import app
from service.formatting import fmt_interval
from service.report.build import build_report
from service.scoring.metrics import wilson_interval
from service.tracking import store

HERE = Path(__file__).resolve().parent
if "report_recorded" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("report_recorded", HERE / "recorded.py")
    sys.modules["report_recorded"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["report_recorded"])
recorded = sys.modules["report_recorded"]
runner = CliRunner()

ADAM = {"lr": 0.1, "optimizer": "adam", "lambda_max": 0.1, "nau_init": "default"}
SGD = {"lr": 0.29, "optimizer": "sgd", "momentum": 0.9, "lambda_max": 0.5, "nau_init": "default"}
POOLED = f"37/40 [{fmt_interval(*wilson_interval(37, 40))}]"  # 32/32 on seeds 4-35, then 5/8 on 36-43


def _one_line(text: str) -> str:
    """A table's text with its borders and line breaks gone (a cell may wrap)."""
    return re.sub(r"\s+", " ", re.sub(r"[│┃|╷╵─━┏┓┗┛┡┩└┘┌┐├┤┼]", " ", text))


def _sweep(uri: str) -> tuple[str, list[str]]:
    best, other = recorded.record_sweep(uri, "pool", [
        ("completed", ADAM, recorded.rate_metrics(3, 4)),
        ("completed", SGD, recorded.rate_metrics(1, 4)),
    ])
    first = recorded.record_validation(uri, "pool", best, 32, 32, first_seed=4, batch=1)
    second = recorded.record_validation(uri, "pool", best, 5, 8, first_seed=36, batch=2)
    return best, [first, second]


def test_status_best_and_compare_show_the_validations_pooled(tmp_path):
    uri = store.default_tracking_uri(tmp_path)
    _, validations = _sweep(uri)
    status = runner.invoke(app, ["status", "pool", "--tracking-uri", uri])
    assert status.exit_code == 0, status.output
    assert f"{POOLED} (32 + 8 seeds)" in _one_line(status.output), status.output
    assert "5/8" not in status.output  # the latest alone is not the figure shown

    best = runner.invoke(app, ["best", "pool", "--tracking-uri", uri], env={"COLUMNS": "250"})
    assert best.exit_code == 0, best.output
    assert f"{POOLED} (32 + 8 seeds)" in _one_line(best.output), best.output
    # the compare link opens the trial with both validations beside it
    link = next(line for line in best.output.splitlines() if "top settings in MLflow" in line)
    assert all(run_id in link for run_id in validations), link

    recorded.record_sweep(uri, "other", [("completed", ADAM, recorded.rate_metrics(2, 4))])
    compare = runner.invoke(app, ["compare", "pool", "other", "--tracking-uri", uri], env={"COLUMNS": "250"})
    assert compare.exit_code == 0, compare.output
    assert f"{POOLED} (32 + 8 seeds)" in _one_line(compare.output), compare.output


def test_the_report_and_its_summary_pool_them(tmp_path):
    uri = store.default_tracking_uri(tmp_path)
    best, validations = _sweep(uri)
    files = build_report(uri, "pool", tmp_path / "out", pngs=False)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    val = summary["validation"]
    assert (val["successes"], val["n"], val["seeds_per_validation"]) == (37, 40, [32, 8])
    assert val["run_ids"] == validations and val["seed_ids"] == "4-35, 36-43"
    assert "37 of 40 fresh seeds" in " ".join(summary["summary"])
    assert "from 2 validations: 32 + 8 seeds" in " ".join(summary["summary"])
    assert summary["verdict"]["ci_low"] == wilson_interval(37, 40)[0]  # judged on the pool
    html = files.html.read_text()
    assert "37/40" in html and "from 2 validations: 32 + 8 seeds" in html
    # the parent run's description in MLflow says the same
    note = store.client(uri).get_run(files.data.view.run_id).data.tags["mlflow.note.content"]
    assert f"On fresh seeds: {POOLED} (from 2 validations: 32 + 8 seeds)" in note, note


def test_only_disjoint_validations_of_the_same_ranges_pool(tmp_path):
    """A validation whose seeds overlap one already pooled, or that tested other ranges
    (an extra --range), is a different sample: the latest validation's figure leaves it out."""
    from service.tracking.pooled import pool

    uri = store.default_tracking_uri(tmp_path)
    best, _ = _sweep(uri)
    recorded.record_validation(uri, "pool", best, 8, 8, first_seed=36, batch=3)  # the same seeds again
    client = store.client(uri)
    runs = client.search_runs([client.get_experiment_by_name("pool").experiment_id],
                              f"tags.`{store.TAG_SOURCE_RUN}` = '{best}'")
    pooled = pool(runs)
    assert [r.data.tags[store.TAG_SEED_IDS] for r in pooled.runs] == ["4-35", "36-43"]
    assert (pooled.metrics["successes"], pooled.metrics["n_seeds"]) == (40, 40)

    far = recorded.record_validation(uri, "pool", best, 6, 8, first_seed=44, batch=4)
    client.log_metric(far, "success_rate_per_range.far", 0.75)
    runs = client.search_runs([client.get_experiment_by_name("pool").experiment_id],
                              f"tags.`{store.TAG_SOURCE_RUN}` = '{best}'")
    pooled = pool(runs)
    assert pooled.run_ids == [far] and (pooled.metrics["successes"], pooled.metrics["n_seeds"]) == (6, 8)
