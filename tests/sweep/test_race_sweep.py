"""Racing end to end (``scheduler: race``) with real Ray, Optuna and MLflow: a setting that
cannot learn leaves after its first block of seeds while good ones get more, each setting
is one MLflow run (per-seed results appended, one point per block), one Optuna trial (one
intermediate value per block, the final value on all its seeds) and one Tune trial, and
the eliminations are those of `race.replay` on the per-seed outcomes the sweep recorded."""

from __future__ import annotations

import csv
import signal
import tempfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from service.cli import app
from service.scoring.race import Outcome, RaceSpec, replay
from service.sweep.kill_points import ENV
from service.tracking import runs, store

runner = CliRunner()
SMOKE = Path(__file__).resolve().parents[2] / "search_spaces" / "smoke.yaml"
NEVER = 1.0e-6  # a learning rate at which no seed moves far enough to succeed in 2,000 steps


def _race_space(tmp_path: Path, lrs: tuple[float, ...] = (0.15, NEVER, 0.1), **scheduler) -> Path:
    """The smoke space's task and model, Adam, three learning rates on a grid: two that
    solve most seeds in 2,000 steps and one that never does."""
    data = yaml.safe_load(SMOKE.read_text())
    data["fixed"]["train"]["optimizer"] = {"name": "adam"}
    data["params"] = {"lr": {"type": "categorical", "choices": list(lrs), "target": "train.optimizer.lr"}}
    data.update(name="race-e2e", trials=len(lrs), concurrency=1, sampler={"type": "grid", "seed": 0},
                scheduler={"type": "race", **scheduler})
    path = tmp_path / "race.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _per_seed(client, run_id: str) -> list[bool]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(client.download_artifacts(run_id, "seeds.csv", tmp))
        rows = list(csv.DictReader(path.open()))
    assert [int(r["seed"]) for r in rows] == list(range(len(rows)))  # block after block, in seed order
    return [r["success"] == "True" for r in rows]


def _assert_race_recorded(optuna_db: str, storage: Path, tune_trials: bool = True) -> None:
    """One MLflow run, Optuna trial and (``tune_trials``) Tune trial per setting; the
    hopeless setting left after its first block; every block recorded once; the standings
    those of `race.replay` on the outcomes the sweep recorded."""
    import optuna
    from ray.tune import ExperimentAnalysis

    client = store.client(store.resolve_tracking_uri(None))
    experiment = client.get_experiment_by_name("race-e2e")
    parent = runs.find_sweep_run(client, experiment.experiment_id, "race-e2e")
    children = runs.trial_runs(client, experiment.experiment_id, parent.info.run_id)
    assert len(children) == 3  # one MLflow run per setting
    children.sort(key=lambda c: int(c.data.tags[store.TAG_OPTUNA_TRIAL]))
    by_lr = {float(c.data.params["lr"]): c for c in children}

    hopeless = by_lr[NEVER]
    assert hopeless.data.tags[store.TAG_RACE_EXIT] == "eliminated"
    assert hopeless.data.tags[store.TAG_RACE_EXIT_BLOCK] == "1"
    assert hopeless.data.metrics["n_seeds"] == 8
    seeds = {float(c.data.params["lr"]): c.data.metrics["n_seeds"] for c in children}
    assert max(seeds.values()) == 16  # a good setting got more seeds
    for child in children:
        history = client.get_metric_history(child.info.run_id, "n_seeds")
        blocks = int(child.data.metrics["n_seeds"]) // 8
        assert sorted((m.step, m.value) for m in history) == [(b, 8.0 * b) for b in range(1, blocks + 1)]
        assert len(client.get_metric_history(child.info.run_id, "success_ci_low")) == blocks
        assert child.data.tags[store.TAG_OUTCOME] == "completed"

    # the race as `race.replay` plays it on the outcomes the sweep recorded, in the order the
    # sampler proposed the settings: a seed the sweep never trained is None (replay fails on it)
    spec = RaceSpec(first_block=8, growth=2, max_seeds=16)
    names = [c.info.run_id for c in children]
    played = {}
    for c in children:
        ok = _per_seed(client, c.info.run_id)
        assert len(ok) == c.data.metrics["n_seeds"]
        played[c.info.run_id] = [Outcome(s) for s in ok] + [None] * (16 - len(ok))
    replayed = replay(played, names, list(range(16)), spec)
    for c in children:
        tags = c.data.tags
        if replayed.pick == c.info.run_id:
            assert tags[store.TAG_RACE_EXIT] == "incumbent"
        else:
            assert tags[store.TAG_RACE_EXIT] == replayed.exits[c.info.run_id].reason
        if tags[store.TAG_RACE_EXIT] in ("eliminated", "lost at max"):
            assert c.data.metrics["n_seeds"] == replayed.exits[c.info.run_id].seeds

    study = optuna.load_study(study_name="race-e2e", storage=optuna_db)
    trials = study.get_trials()
    assert len(trials) == 3  # one Optuna trial per setting
    for t, c in zip(sorted(trials, key=lambda t: t.number), children):
        assert t.state == optuna.trial.TrialState.COMPLETE
        assert sorted(t.intermediate_values) == list(range(1, int(c.data.metrics["n_seeds"]) // 8 + 1))
        assert t.value == pytest.approx(c.data.metrics["objective"])  # the value on all its seeds
    if tune_trials:  # a resumed sweep's Tune experiment lacks a trial that ended after its last snapshot
        assert len(ExperimentAnalysis(str(storage / "race-e2e")).trials) == 3  # one Tune trial each


@pytest.mark.slow
def test_a_race_eliminates_a_hopeless_setting_after_its_first_block(ray_address, tmp_path):
    # blocks of 8, at most 16 seeds: 0/8 against ≥ 6/8 is below the level alpha/2 = 0.025
    space = _race_space(tmp_path, first_block=8, growth=2, max_seeds=16)
    optuna_db = f"sqlite:///{tmp_path / 'optuna.db'}"
    result = runner.invoke(app, ["sweep", str(space), "--optuna-storage", optuna_db,
                                 "--storage-path", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "3 trials × 8–16 seeds (raced)" in " ".join(result.output.split())

    _assert_race_recorded(optuna_db, tmp_path / "runs")

    status = runner.invoke(app, ["status", "race-e2e"])
    assert status.exit_code == 0, status.output
    assert "eliminated after block 1" in status.output and "incumbent" in status.output
    best = runner.invoke(app, ["best", "race-e2e", "--top", "3"])
    assert best.exit_code == 0 and "eliminated after block 1" in " ".join(best.output.split()), best.output
    _assert_race_drawn(tmp_path)


@pytest.mark.slow
def test_a_first_block_is_stopped_early_by_steps_with_a_grace_period_on_two_tasks(ray_address, tmp_path):
    """``scheduler: {type: race, grace_period: 1000}`` on a space of two tasks: the hopeless
    setting's first block is stopped at its 1,000-step rung (below the good setting's
    objective there: the grid sampler proposes the good one first), before any seed
    finished: its run is pruned after 4 evaluations of its first task, tagged "stopped by
    steps", its Optuna trial PRUNED. The good setting races on (task, seed) instances: 16
    seeds on each task, both tasks' outcomes in the race."""
    import json

    import optuna

    space = _race_space(tmp_path, lrs=(NEVER, 0.15), first_block=8, growth=2, max_seeds=16, grace_period=1000)
    data = yaml.safe_load(space.read_text())
    task = data.pop("task")
    data["tasks"] = {"near": task, "far": {**task, "extrapolation": {"far": "U[2,10]"}}}
    space.write_text(yaml.safe_dump(data))
    optuna_db = f"sqlite:///{tmp_path / 'optuna.db'}"
    result = runner.invoke(app, ["sweep", str(space), "--optuna-storage", optuna_db,
                                 "--storage-path", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output

    client = store.client(store.resolve_tracking_uri(None))
    experiment = client.get_experiment_by_name("race-e2e")
    parent = runs.find_sweep_run(client, experiment.experiment_id, "race-e2e")
    by_lr = {float(c.data.params["lr"]): c for c in runs.trial_runs(client, experiment.experiment_id,
                                                                      parent.info.run_id)}
    good, hopeless = by_lr[0.15], by_lr[NEVER]
    assert hopeless.data.tags[store.TAG_OUTCOME] == "pruned"
    assert hopeless.data.tags[store.TAG_RACE_EXIT] == "stopped by steps"
    assert hopeless.data.tags[store.TAG_RACE_EXIT_BLOCK] == "0"
    evaluations = client.get_metric_history(hopeless.info.run_id, "objective")
    assert sorted(m.step for m in evaluations) == [0, 0, 0, 0]  # 250 … 1,000 steps of its first block, then stopped
    assert good.data.tags[store.TAG_RACE_EXIT] == "incumbent"
    # its first block's 2 × 7 evaluations before its end, at step 0, then one point per block
    assert sorted(m.step for m in client.get_metric_history(good.info.run_id, "n_seeds")) == [0] * 14 + [1, 2]

    race = json.loads((tmp_path / "runs" / "race-e2e.race_state.json").read_text())
    key = good.data.tags[store.TAG_TRIAL_KEY]
    outcomes = json.loads(race["trials"][key]["outcomes"])
    assert {t: len(rows) for t, rows in outcomes.items()} == {"near": 16, "far": 16}  # (task, seed) instances
    assert list(race["trials"]) == [key]  # the stopped setting has no outcome in the race

    study = {t.params["lr"]: t for t in optuna.load_study(study_name="race-e2e", storage=optuna_db).get_trials()}
    assert study[NEVER].state == optuna.trial.TrialState.PRUNED and list(study[NEVER].intermediate_values) == [0]
    assert study[0.15].state == optuna.trial.TrialState.COMPLETE
    assert sorted(study[0.15].intermediate_values) == [1, 2]

    status = runner.invoke(app, ["status", "race-e2e"])
    assert status.exit_code == 0 and "stopped by steps in block 1" in status.output, status.output


# what the report's race panel draws: per trace, its legend text and its points' centres
RACE_DRAWN = """(() => {
  const box = el => { const r = el.getBoundingClientRect(); return [(r.left + r.right) / 2, (r.top + r.bottom) / 2]; };
  const plot = document.getElementById('plot-race');
  return {
    legend: Array.from(plot.querySelectorAll('.legend .traces .legendtext')).map(t => t.textContent),
    traces: Array.from(plot.querySelectorAll('.scatterlayer .trace')).map(
      t => Array.from(t.querySelectorAll('.points path.point')).map(box)),
  };
})()"""


def _assert_race_drawn(tmp_path: Path) -> None:
    """The report's race panel, where the browser draws it: one line per setting, the
    hopeless one a single point at 8 seeds left of the 16-seed end of the longest line."""
    import importlib.util
    import sys

    from service.report.build import build_report

    here = Path(__file__).resolve().parents[1] / "report"
    if "report_browser" not in sys.modules:
        spec = importlib.util.spec_from_file_location("report_browser", here / "browser.py")
        sys.modules["report_browser"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["report_browser"])
    browser = sys.modules["report_browser"]
    binary = browser.chromium()
    if binary is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    files = build_report(store.resolve_tracking_uri(None), "race-e2e", tmp_path / "report", log_to_mlflow=False,
                         pngs=False)
    page = browser.Page(binary, tmp_path / "chromium-profile")
    try:
        page.load(files.html.resolve().as_uri())
        drawn = page.evaluate(RACE_DRAWN)
        assert page.errors() == []
    finally:
        page.close()
    assert len(drawn["traces"]) == 3, drawn
    legend = dict(zip(drawn["legend"], drawn["traces"]))
    hopeless = [points for text, points in legend.items() if text.endswith("eliminated after block 1")]
    assert len(hopeless) == 1 and len(hopeless[0]) == 1, drawn
    longest = max(drawn["traces"], key=len)
    assert len(longest) == 2 and hopeless[0][0][0] < longest[-1][0] - 50, drawn  # 8 seeds, left of 16


@pytest.mark.slow
def test_a_race_killed_after_its_decisions_resumes_to_the_same_race(ray_address, tmp_path, monkeypatch, cli_process):
    """The driver SIGKILLed right after a block's decision (Tune's snapshot older), twice:
    after the race's fourth decision, then after the resumed driver's first; then resumed to
    the end. The resumed race reads back who is the incumbent and who left (`RaceFile`),
    including trials Tune never runs again, so the records are those of one uninterrupted
    race: each setting once, every block recorded once, the standings `race.replay`'s."""
    _race_space(tmp_path, first_block=8, growth=2, max_seeds=16)
    optuna_db = f"sqlite:///{tmp_path / 'optuna.db'}"
    args = ["sweep", "race.yaml", "--optuna-storage", optuna_db]
    for number, moment in enumerate(["race_decided:4", "race_decided:1"]):
        monkeypatch.setenv(ENV, moment)
        killed = cli_process([*args, *(["--resume"] if number else [])], tmp_path, ray_address)
        assert killed.returncode == -signal.SIGKILL, (moment, killed.stdout)
        assert "Traceback" not in killed.stdout, killed.stdout
    monkeypatch.delenv(ENV)
    done = cli_process([*args, "--resume"], tmp_path, ray_address)
    assert done.returncode == 0, done.stdout
    assert "Traceback" not in done.stdout, done.stdout

    _assert_race_recorded(optuna_db, tmp_path / "runs", tune_trials=False)


def test_racing_refuses_asha_settings(tmp_path):
    space = _race_space(tmp_path)
    data = yaml.safe_load(space.read_text())
    data["scheduler"] = {"type": "race", "reduction_factor": 2, "brackets": 2, "first_block": 32, "max_seeds": 16}
    space.write_text(yaml.safe_dump(data))
    bad = runner.invoke(app, ["sweep", str(space)])
    text = " ".join(bad.output.split())
    assert bad.exit_code == 2 and "scheduler.brackets: ASHA's setting" in text, bad.output
    assert "scheduler.reduction_factor: with 'type: race' only for stopping first blocks by steps" in text
    assert "max_seeds (16) must be at least first_block (32)" in text and "Traceback" not in bad.output
    data["scheduler"] = {"type": "asha", "max_seeds": 16}
    space.write_text(yaml.safe_dump(data))
    asha = runner.invoke(app, ["sweep", str(space)])
    assert asha.exit_code == 2 and "scheduler.max_seeds: only for 'type: race'" in " ".join(asha.output.split())


def test_the_command_line_scheduler_replaces_the_files():
    from service.search.loading import load_space, with_overrides

    smoke = load_space(SMOKE)  # ASHA with a grace period and a reduction factor of 2
    raced = with_overrides(smoke, scheduler="race")
    assert raced.scheduler.type == "race" and raced.scheduler.race() == RaceSpec()
    assert raced.trial_seeds() == 64 and smoke.trial_seeds() == smoke.seeds
    again = with_overrides(with_overrides(smoke, scheduler="race").model_copy(), scheduler="race", trials=2)
    assert again.scheduler == raced.scheduler  # the same scheduler keeps the file's settings


def test_validation_seeds_start_beyond_every_block_a_race_can_reach(tmp_path):
    from service.search.loading import load_space
    from service.sweep.validation import fresh_offset, used_seed_ids

    space = load_space(_race_space(tmp_path, first_block=4, max_seeds=64))
    used = used_seed_ids(space, [{"lr": "0.1"}], [])
    assert set(range(64)) <= used and fresh_offset(used) == 64


def test_a_block_trains_the_same_seeds_as_one_big_batch(tmp_path):
    """Pairing: block 1's seeds (4-7) learn exactly as seeds 4-7 of one batch of 0-7."""
    from service.search.assign import run_configs
    from service.search.loading import parse_space
    from service.sweep.race_trial import block_configs
    from service.training import Trainer

    data = yaml.safe_load(_race_space(tmp_path, first_block=4, max_seeds=8).read_text())
    data.update(steps=60, eval_every=30)
    data["fixed"]["train"]["regularizer"] = {"shape": "linear", "lambda_max": 0.1, "t_start": 10, "t_end": 40}
    space = parse_space(data)
    configs = run_configs(space, {"lr": 0.1})
    spec = space.scheduler.race()
    blocks = [block_configs(configs, spec, b)["small_mul"] for b in range(2)]
    assert [(c.seed_offset, c.seeds) for c in blocks] == [(0, 4), (4, 4)]
    whole = Trainer(configs["small_mul"]).run().seeds
    block = Trainer(blocks[1]).run().seeds
    assert [s.seed for s in block] == [4, 5, 6, 7]
    assert [s.model_dump() for s in block] == [s.model_dump() for s in whole[4:]]


def test_the_race_is_written_through_and_read_back_by_a_scheduler_unpickled_as_it_began(tmp_path):
    """What a resume relies on, without Ray: a scheduler pickled before the race (as Tune
    keeps it) reads back, before its first decision, the state another scheduler wrote
    after each of its decisions, and decides on from there; an absent file starts afresh."""
    import json
    import pickle
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from service.sweep.race_scheduler import RaceScheduler
    from service.sweep.race_trial import RACE_BLOCK, RACE_OUTCOMES, RACE_SEEDS

    spec = RaceSpec(first_block=8, growth=2, max_seeds=16)
    path = str(tmp_path / "exp" / "race_state.json")
    as_begun = pickle.dumps(RaceScheduler(spec, None, path))

    def report(scheduler, key: str, successes: list[bool]) -> str:
        result = {RACE_OUTCOMES: json.dumps({"t": [[int(s), None] for s in successes]}),
                  RACE_SEEDS: len(successes), RACE_BLOCK: len(successes) // 8}
        return scheduler.on_trial_result(None, SimpleNamespace(trial_id=f"id-{key}", config={}), result)

    first = RaceScheduler(spec, None, path)
    assert report(first, "a", [True] * 8) == TrialScheduler.CONTINUE  # the incumbent trains on
    assert report(first, "b", [False] * 8) == TrialScheduler.STOP  # 0/8 against 8/8

    resumed = pickle.loads(as_begun)
    assert report(resumed, "b", [False] * 8) == TrialScheduler.STOP  # its lost report, decided again
    assert resumed.incumbent == "id-a" and resumed.exits == {"id-b": ("eliminated", 8)}
    assert report(resumed, "c", [False] * 8) == TrialScheduler.STOP  # judged against a's recorded seeds
    afresh = RaceScheduler(spec, None, str(tmp_path / "elsewhere" / "race_state.json"))
    assert report(afresh, "c", [False] * 8) == TrialScheduler.CONTINUE and afresh.incumbent == "id-c"


def test_a_first_block_below_the_rungs_cut_is_stopped_by_steps_and_the_file_keeps_it(tmp_path):
    """``scheduler.grace_period`` with a race: a first block reports after each evaluation,
    and ASHA's rule over first blocks (rungs at 1, 3 reports; keep the top third) stops one
    below the cut before it has any outcome; the decisions survive a scheduler unpickled as
    the sweep began. Without rungs the same reports never stop anything."""
    import json
    import pickle
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from service.scoring.objective import OBJECTIVE
    from service.sweep.race_scheduler import STOPPED_BY_STEPS, RaceScheduler
    from service.sweep.race_trial import (
        RACE_BLOCK,
        RACE_OUTCOMES,
        RACE_REPORT,
        RACE_SEEDS,
    )
    from service.sweep.rungs import RungSpec

    spec = RaceSpec(first_block=8, growth=2, max_seeds=16)
    rungs = RungSpec(name="s", grace=1, max_t=4, reduction_factor=3.0)
    path = str(tmp_path / "exp" / "race_state.json")
    as_begun = pickle.dumps(RaceScheduler(spec, None, path, rungs=rungs))

    def at(scheduler, key: str, report: int, objective: float) -> str:
        result = {OBJECTIVE: objective, RACE_REPORT: report, RACE_BLOCK: 0}
        return scheduler.on_trial_result(None, SimpleNamespace(trial_id=f"id-{key}", config={}), result)

    race = RaceScheduler(spec, None, path, rungs=rungs)
    assert at(race, "a", 1, 0.9) == TrialScheduler.CONTINUE  # the first at the rung: nothing to compare
    assert at(race, "a", 2, 0.9) == TrialScheduler.CONTINUE  # between rungs
    assert at(race, "b", 1, 0.1) == TrialScheduler.STOP  # below a's 0.9: the top third goes on
    assert race.exits == {"id-b": (STOPPED_BY_STEPS, 0)}
    assert at(race, "c", 1, 0.95) == TrialScheduler.CONTINUE  # above the cut

    resumed = pickle.loads(as_begun)
    assert at(resumed, "b", 1, 0.1) == TrialScheduler.STOP  # its report made again after a kill
    assert at(resumed, "d", 1, 0.5) == TrialScheduler.STOP  # judged against the recorded 0.9, 0.1, 0.95
    assert at(resumed, "e", 1, 0.99) == TrialScheduler.CONTINUE
    block = {RACE_OUTCOMES: json.dumps({"t": [[1, None]] * 8}), RACE_SEEDS: 8, RACE_BLOCK: 1}
    assert resumed.on_trial_result(None, SimpleNamespace(trial_id="id-a", config={}), block) == TrialScheduler.CONTINUE
    assert resumed.incumbent == "id-a"  # the first block to finish: a setting stopped by steps has none

    no_rungs = RaceScheduler(spec, None, None)
    assert at(no_rungs, "a", 1, 0.9) == at(no_rungs, "b", 1, 0.0) == TrialScheduler.CONTINUE
