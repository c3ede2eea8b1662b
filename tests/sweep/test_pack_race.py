"""A racing pack (``scheduler: race`` with ``pack: K``) without Ray: the members' blocks
train as one computation, each member's seeds learn exactly as the same setting's lone
racing trial's, the race board decides as the race does on those outcomes, and a pack
interrupted after a block continues at the next, training no block twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from service.scoring.race import RaceSpec
from service.search.assign import run_configs
from service.search.loading import parse_space
from service.sweep.pack import Member
from service.sweep.pack_race import PackRaceState, run_pack_race
from service.sweep.race_board import RaceBoard, RaceBoardSpec
from service.sweep.race_scheduler import ELIMINATED, INCUMBENT, Race
from service.sweep.race_trial import RACE_BLOCK, RaceState, block_configs
from service.sweep.results import DONE, MEMBERS, member_results

SMOKE = Path(__file__).resolve().parents[2] / "search_spaces" / "smoke.yaml"
NEVER = 1.0e-6  # no seed moves far enough to succeed
LRS = (0.15, NEVER, 0.1)


def _space():
    data = yaml.safe_load(SMOKE.read_text())
    data["fixed"]["train"]["optimizer"] = {"name": "adam"}
    data["fixed"]["train"]["regularizer"] = {"shape": "linear", "lambda_max": 0.1, "t_start": 200, "t_end": 800}
    data["params"] = {"lr": {"type": "loguniform", "low": NEVER, "high": 0.3, "target": "train.optimizer.lr"}}
    # the sweep's sampler proposes 0.078, 6.6e-5, 0.031 (one pack): only the first solves seeds
    data.update(name="pack-race", trials=3, pack=3, steps=1400, eval_every=200, sampler={"type": "random", "seed": 6},
                scheduler={"type": "race", "first_block": 4, "growth": 2, "max_seeds": 8, "alpha": 0.45})
    return parse_space(data)


def _members(space):
    return [Member(i, i, {"lr": lr}, run_configs(space, {"lr": lr})) for i, lr in enumerate(LRS)]


def _board(space, path: Path) -> RaceBoard:
    return RaceBoard(RaceBoardSpec("pack-race", space.scheduler.race(), str(path)))


@pytest.fixture(scope="module")
def lone():
    """Each setting's seeds trained alone, block by block (as a lone racing trial does)."""
    from service.training import Trainer

    space = _space()
    spec = space.scheduler.race()
    out = {}
    for lr in LRS:
        configs = run_configs(space, {"lr": lr})
        out[lr] = [s for b in range(len(spec.budgets()))
                   for s in Trainer(block_configs(configs, spec, b)["small_mul"]).run().seeds]
    return out


def test_a_racing_pack_trains_each_setting_as_alone_and_races_it_as_the_race_would(tmp_path, lone):
    space = _space()
    members = _members(space)
    reports = []
    run_pack_race(members, space, reports.append, _board(space, tmp_path / "race_state.json"), "t0")

    # the race (sign test) on the lone outcomes, members reporting in pack order after each block
    race = Race(RaceSpec(first_block=4, growth=2, max_seeds=8, alpha=0.45))  # 4 seeds can eliminate
    standings = {}
    for block, budget in enumerate((4, 8)):
        for i, lr in enumerate(LRS):
            if i in standings:
                continue
            seeds = lone[lr][:budget]
            if race.block_report(f"t0.{i}", json.dumps({"small_mul": [[int(s.success), None] for s in seeds]}),
                                 budget, block + 1):
                standings[i] = block + 1
    assert standings == {1: 1, 2: 2, 0: 2}  # the hopeless setting leaves after its first block
    assert race.standing("t0.1")[0] == ELIMINATED

    last = member_results(reports[-1])
    assert len(reports) == 2  # one report per block
    for i, lr in enumerate(LRS):
        shown = last[i]
        assert shown["state"] == DONE
        assert shown[RACE_BLOCK] == standings[i]  # it left where the race on the lone outcomes says
        assert shown["n_seeds"] == (4, 8)[standings[i] - 1]
        assert shown["successes"] == sum(s.success for s in lone[lr][:int(shown["n_seeds"])])
    tagged = {k: v for k, v, _ in json.loads(reports[0]["race/standings"])}
    assert tagged["t0.1"] == ELIMINATED and tagged["t0.0"] == INCUMBENT
    assert all(f"{MEMBERS}/1/n_seeds" in r for r in reports)  # a member that left is still shown


def test_a_racing_pack_interrupted_after_a_block_continues_at_the_next(tmp_path, lone):
    """The first block's checkpoint saved, then the pack dies; a new board (reading the race
    file back, as a resumed sweep's) and the checkpoint continue it: the second block only,
    with the same outcomes as an uninterrupted pack."""
    space = _space()
    saved = tmp_path / "checkpoint"

    class Killed(Exception):
        pass

    def report_checkpoint(result, state):
        if state.blocks == 1:
            saved.mkdir()
            state.save(saved)
        raise Killed

    path = tmp_path / "race_state.json"
    with pytest.raises(Killed):
        run_pack_race(_members(space), space, lambda r: None, _board(space, path), "t0",
                      report_checkpoint=report_checkpoint)
    members = _members(space)
    resume = PackRaceState.load(saved, [m.configs for m in members])
    assert resume.blocks == 1 and resume.states == ["running", "done", "running"]
    assert isinstance(resume.members[0], RaceState) and resume.members[1] is None
    trained = []
    board = _board(space, path)
    blocks = board.blocks

    def counted(reports):
        trained.append({k: v[2] for k, v in reports.items()})
        return blocks(reports)

    board.blocks = counted
    reports = []
    run_pack_race(members, space, reports.append, board, "t0", resume=resume)
    assert trained == [{"t0.0": 2, "t0.2": 2}]  # block 2 of the two still racing; block 1 not again
    last = member_results(reports[-1])
    for i in (0, 2):
        assert last[i]["n_seeds"] == 8
        assert last[i]["successes"] == sum(s.success for s in lone[LRS[i]])
    assert 1 not in last  # it left before the interruption: its run holds its result


def test_a_racing_pack_with_a_grace_period_drops_a_first_block_stopped_by_steps(tmp_path):
    """``grace_period``: at each evaluation of a first block the board applies ASHA's rule
    over the members' first blocks (pack order); the hopeless member, below the cut at its
    first rung, leaves the computation there, "stopped by steps", and trains no more."""
    from service.sweep.race_scheduler import STOPPED_BY_STEPS
    from service.sweep.rungs import RungSpec

    data = _space().model_dump(mode="json", exclude_none=True)
    data["scheduler"]["grace_period"] = 400
    space = parse_space(data)
    rungs = RungSpec("pack-race", space.grace_reports(), space.total_reports(), space.scheduler.reduction_factor)
    board = RaceBoard(RaceBoardSpec("pack-race", space.scheduler.race(), str(tmp_path / "race.json"), rungs))
    reports = []
    run_pack_race(_members(space), space, reports.append, board, "t0")
    inside = [member_results(r) for r in reports if member_results(r)[0][RACE_BLOCK] == 0]
    states = [r[1]["state"] for r in inside]
    assert states[:2] == ["running", "pruned"] and set(states[2:]) == {"pruned"}  # 200 steps; 400: its rung
    assert [r[1]["step"] for r in inside][1:] == [400] * (len(inside) - 1)  # it trained no further
    assert [r[0]["state"] for r in inside] == ["running"] * len(inside)
    tagged = [(k, v) for r in reports for k, v, _ in json.loads(r["race/standings"])]
    assert ("t0.1", STOPPED_BY_STEPS) in tagged
    last = member_results(reports[-1])
    assert last[1]["state"] == "pruned" and last[0]["state"] == DONE  # (lr 0.1 may be cut at a later rung)
    assert "t0.1" not in board.race.outcomes  # it never reached the race by seeds


@pytest.mark.slow
def test_a_packed_race_sweep_killed_after_a_block_resumes_to_the_race_of_its_outcomes(
        ray_address, tmp_path, monkeypatch, cli_process):
    """A real sweep, three settings in one pack (``--pack 3``), racing: the driver SIGKILLed
    just after it tagged the first block's standings, then resumed to the end. One MLflow
    run, Optuna trial and race entry per setting; every block recorded once (one point per
    block); each setting's standing and seeds those of the race (`Race`, members in pack
    order) on the per-seed outcomes the sweep recorded; an Optuna trial per setting,
    COMPLETE with one intermediate value per block and its value on all its seeds."""
    import csv
    import signal
    import tempfile

    import optuna

    from service.sweep.kill_points import ENV
    from service.tracking import runs, store

    space = _space()
    data = space.model_dump(mode="json", exclude_none=True)
    (tmp_path / "race.yaml").write_text(yaml.safe_dump(data))
    optuna_db = f"sqlite:///{tmp_path / 'optuna.db'}"
    args = ["sweep", "race.yaml", "--optuna-storage", optuna_db]
    monkeypatch.setenv(ENV, "race_told:1")
    killed = cli_process(args, tmp_path, ray_address)
    assert killed.returncode == -signal.SIGKILL, killed.stdout
    monkeypatch.delenv(ENV)
    done = cli_process([*args, "--resume"], tmp_path, ray_address)
    assert done.returncode == 0, done.stdout
    assert "Traceback" not in killed.stdout + done.stdout, done.stdout

    client = store.client(store.resolve_tracking_uri(None))
    experiment = client.get_experiment_by_name("pack-race")
    parent = runs.find_sweep_run(client, experiment.experiment_id, "pack-race")
    children = sorted(runs.trial_runs(client, experiment.experiment_id, parent.info.run_id),
                      key=lambda c: int(c.data.tags[store.TAG_PACK_INDEX]))
    assert len(children) == 3 and len({c.data.tags[store.TAG_PACK_GROUP] for c in children}) == 1
    assert sorted(c.data.tags[store.TAG_RACE_EXIT] for c in children) == ["eliminated", "eliminated", "incumbent"]
    saved = json.loads((tmp_path / "runs" / "pack-race.race_state.json").read_text())
    assert sorted(saved["trials"]) == sorted(c.data.tags[store.TAG_TRIAL_KEY] for c in children)
    race = Race(space.scheduler.race())
    outcomes = {}  # as the race file holds them (success, and the loss the race breaks ties by at the max)
    for c in children:
        with tempfile.TemporaryDirectory() as tmp:
            rows = list(csv.DictReader(Path(client.download_artifacts(c.info.run_id, "seeds.csv", tmp)).open()))
        assert [int(r["seed"]) for r in rows] == list(range(len(rows)))
        outcomes[c.info.run_id] = json.loads(saved["trials"][c.data.tags[store.TAG_TRIAL_KEY]]["outcomes"])["small_mul"]
        assert [ok for ok, _ in outcomes[c.info.run_id]] == [int(r["success"] == "True") for r in rows]
    left = {}
    for block, budget in enumerate(space.scheduler.race().budgets()):
        for c in children:
            if c.info.run_id not in left:
                rows = outcomes[c.info.run_id][:budget]
                assert len(rows) == budget  # it trained this block: the race had not stopped it
                if race.block_report(c.info.run_id, json.dumps({"small_mul": rows}), budget, block + 1):
                    left[c.info.run_id] = block + 1
    study = {t.number: t for t in optuna.load_study(study_name="pack-race", storage=optuna_db).get_trials()}
    assert len(study) == 3
    for c in children:
        blocks = left[c.info.run_id]
        assert len(outcomes[c.info.run_id]) == space.scheduler.race().budgets()[blocks - 1]
        assert c.data.tags[store.TAG_RACE_EXIT] == race.standing(c.info.run_id)[0]
        assert c.data.tags[store.TAG_RACE_EXIT_BLOCK] == str(blocks)
        assert c.data.tags[store.TAG_OUTCOME] == "completed"
        history = client.get_metric_history(c.info.run_id, "n_seeds")
        assert sorted((m.step, m.value) for m in history) == [(b, 4.0 * b) for b in range(1, blocks + 1)]
        trial = study[int(c.data.tags[store.TAG_OPTUNA_TRIAL])]
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert sorted(trial.intermediate_values) == list(range(1, blocks + 1))
        assert trial.value == pytest.approx(c.data.metrics["objective"])
