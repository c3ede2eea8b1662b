"""Packs without Ray (`service.sweep.pack`, `pack_search`, `search.packing`): real training at
a tiny size, a list standing for Tune, a real Optuna study driven by hand."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from service.pack_structure import structure_key
from service.search.assign import run_configs
from service.search.loading import load_space, parse_space
from service.search.packing import packable_params
from service.search.sampler import DefineByRun
from service.search.space import SearchSpaceError
from service.sweep import pack_search
from service.sweep.pack import Member, PackState, run_pack
from service.sweep.pack_search import PackedOptunaSearch
from service.sweep.results import DONE, PACK_MEMBERS, PRUNED, RUN_CONFIGS, STATE, STEP, member_results
from service.sweep.searcher import make_sampler
from service.sweep.trial import params_digest, run_trial
from service.tracking.store import TAG_PARAMS_SHA256

TASK = {"kind": "small_mul", "eval_samples": 200, "threshold_samples": 10_000}
LRS = (0.02, 0.05, 0.2)
States = optuna.trial.TrialState
SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


def _space(**extra):
    data = {
        "name": "tiny", "steps": 200, "eval_every": 50, "seeds": 4, "checkpoint_every": 2, "task": TASK, "pack": 3,
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu", "compile": "off",
                  "train": {"batch_size": 32, "regularizer": {"lambda_max": 0.1, "t_start": 50, "t_end": 150}}},
        "params": {"lr": {"type": "loguniform", "low": 1e-2, "high": 0.3, "target": "train.optimizer.lr"},
                   "optimizer": {"type": "categorical", "choices": ["adam", "rmsprop"],
                                 "target": "train.optimizer.name"}},
    }
    data.update(extra)
    return parse_space(data)


class Recorder:
    """A tracker that keeps what a trial logs."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.tags: dict[str, str] = {}
        self.outcome: str | None = None

    def log_metrics(self, metrics, step):
        assert self.outcome is None, "logged after the run was closed"
        self.steps.append(step)

    def log_artifact_dir(self, directory, artifact_path=None):
        assert (Path(directory) / "seeds.csv").is_file() or any(Path(directory).iterdir())

    def set_tags(self, tags):
        self.tags.update(tags)

    def close(self, outcome):
        self.outcome = self.outcome or str(outcome)


def _members(space, lrs=LRS):
    out = []
    for i, lr in enumerate(lrs):
        params = {"lr": lr, "optimizer": "adam"}
        out.append(Member(i, 10 + i, params, run_configs(space, params), tracker=Recorder()))
    return out


def _alone(space, member):
    return run_trial(member.params, space, lambda m: None)


def test_each_member_of_a_pack_is_its_own_trial_and_trains_as_alone():
    space = _space(task=None, tasks={"near": TASK, "far": {**TASK, "extrapolation": {"far": "U[2,20]"}}})
    members = _members(space)
    reports, judged = [], []

    def judge(iteration, values):
        judged.append((iteration, sorted(values)))
        return [11] if iteration == 2 else []  # the second member stops at the second report

    run_pack(members, space, reports.append, judge=judge)
    assert [r[STEP] for r in reports] == [50, 100, 150, 200, 250, 300, 350, 400]  # one per evaluation
    assert judged[:3] == [(1, [10, 11, 12]), (2, [10, 11, 12]), (3, [10, 12])]  # a report number, as Tune counts
    stopped = [member_results(r)[1][STATE] for r in reports]
    assert stopped == ["running"] + [PRUNED] * 7
    assert member_results(reports[-1])[0][STATE] == DONE
    assert members[1].tracker.outcome == "pruned" and members[1].tracker.steps == [0, 50, 100]
    assert TAG_PARAMS_SHA256 not in members[1].tracker.tags
    for m in (members[0], members[2]):
        alone = _alone(space, m)
        assert m.state == DONE and m.tracker.outcome == "completed"
        assert m.tracker.tags[TAG_PARAMS_SHA256] == params_digest(alone.results)  # bit for bit
        assert m.metrics == alone.final_metrics == m.progress.final_metrics
        assert member_results(reports[-1])[m.index]["objective"] == alone.final_metrics["objective"]


def test_a_pack_resumed_from_its_checkpoint_ends_as_an_uninterrupted_one(tmp_path):
    space = _space()

    class Crash(Exception):
        pass

    def report_checkpoint(metrics, state):
        state.save(tmp_path)
        if metrics[STEP] >= 100:
            raise Crash

    with pytest.raises(Crash):
        run_pack(_members(space), space, lambda r: None, judge=lambda it, v: [12] if it == 1 else [],
                 report_checkpoint=report_checkpoint)
    resumed = _members(space)
    state = PackState.load(tmp_path, [m.configs for m in resumed])
    assert state.states == ["running", "running", PRUNED] and state.step == 100 and state.members[2] is None
    reports = []
    run_pack(resumed, space, reports.append, resume=state, report_checkpoint=lambda m, s: reports.append(m))
    assert [r[STEP] for r in reports] == [150, 200]
    assert [m.state for m in resumed] == [DONE, DONE, PRUNED]
    for m in resumed[:2]:
        assert m.tracker.tags[TAG_PARAMS_SHA256] == params_digest(_alone(space, m).results)
    with pytest.raises(Exception, match="does not fit this pack"):
        PackState.load(tmp_path, [m.configs for m in resumed[:2]])



def test_a_pack_resumed_in_a_later_task_after_a_member_was_pruned(tmp_path):
    """Two tasks; the first member stops at the first report, and the pack is checkpointed
    and crashes in the second task, where its trainer holds only the two others. Each
    checkpoint is its member's (its place in the pack, not among the members still
    training): the pack resumes and both end as they do alone."""
    space = _space(task=None, tasks={"near": TASK, "far": {**TASK, "extrapolation": {"far": "U[2,20]"}}})

    class Crash(Exception):
        pass

    def report_checkpoint(metrics, state):
        state.save(tmp_path)
        if metrics[STEP] >= 300:  # the second task's first checkpoint (steps 200-400)
            raise Crash

    with pytest.raises(Crash):
        run_pack(_members(space), space, lambda r: None, judge=lambda it, v: [10] if it == 1 else [],
                 report_checkpoint=report_checkpoint)
    resumed = _members(space)
    state = PackState.load(tmp_path, [m.configs for m in resumed])
    assert state.states == [PRUNED, "running", "running"] and (state.task_index, state.step) == (1, 300)
    assert state.members[0] is None and all(state.members[i].trainer is not None for i in (1, 2))
    reports = []
    run_pack(resumed, space, reports.append, resume=state, report_checkpoint=lambda m, s: reports.append(m))
    assert [r[STEP] for r in reports] == [350, 400]
    assert [m.state for m in resumed] == [PRUNED, DONE, DONE]
    for m in resumed[1:]:
        assert m.tracker.tags[TAG_PARAMS_SHA256] == params_digest(_alone(space, m).results)

def _searcher(space, url, planned):
    searcher = PackedOptunaSearch(pack=space.pack, planned=planned, space=DefineByRun(space), metric="objective",
                                  mode="max", sampler=make_sampler(space), study_name="s",
                                  storage=optuna.storages.RDBStorage(url))
    searcher.set_search_properties(None, None, {})
    return searcher


def _pack_result(step, iteration, shown):
    out = {"objective": 0.0, STEP: step, "training_iteration": iteration}
    for index, (state, objective) in shown.items():
        out.update({f"members/{index}/{STATE}": state, f"members/{index}/objective": objective})
    return out


def test_the_searcher_asks_optuna_for_packs_and_tells_each_member(tmp_path):
    space = _space(pack=2, sampler={"type": "random", "seed": 3})
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = _searcher(space, url, planned=3)
    first, second = searcher.suggest("a")[PACK_MEMBERS], searcher.suggest("b")[PACK_MEMBERS]
    assert [len(first), len(second)] == [2, 1] and searcher.suggest("c") == searcher.FINISHED
    assert first[0]["params"]["optimizer"] == first[1]["params"]["optimizer"]  # the structure is shared
    assert first[0]["params"]["lr"] != first[1]["params"]["lr"]  # the continuous setting is searched
    assert first[0][RUN_CONFIGS]["small_mul"].train.optimizer.lr == first[0]["params"]["lr"]

    searcher.on_trial_result("a", _pack_result(50, 1, {0: ("running", 0.2), 1: ("running", 0.1)}))
    searcher.on_trial_result("a", _pack_result(100, 2, {0: ("running", 0.3), 1: (PRUNED, 0.1)}))
    searcher.save(str(tmp_path / "searcher.pkl"))
    restored = _searcher(space, url, planned=3)
    restored.restore(str(tmp_path / "searcher.pkl"))  # nothing it still runs is marked abandoned
    restored.on_trial_complete("a", _pack_result(200, 4, {0: (DONE, 0.6), 1: (PRUNED, 0.1)}))
    restored.on_trial_complete("b", None, error=True)
    study = optuna.load_study(study_name="s", storage=url)
    assert [(t.state, t.value) for t in study.trials] == [
        (States.COMPLETE, 0.6), (States.PRUNED, 0.1), (States.FAIL, None)]
    assert study.trials[0].intermediate_values == {1: 0.2, 2: 0.3}
    assert study.trials[1].user_attrs == {"nalu_sweep.pack_group": "a", "nalu_sweep.pack_index": 1}


def test_a_member_that_does_not_share_the_structure_leads_a_later_pack(tmp_path, monkeypatch):
    space = _space(pack=2)
    keys = iter(["x", "y", "y", "z"])  # only the first trial asked has its structure
    monkeypatch.setattr(pack_search, "structure_key", lambda config: next(keys))
    searcher = _searcher(space, f"sqlite:///{tmp_path / 'optuna.db'}", planned=4)
    packs = [[m["number"] for m in searcher.suggest(t)[PACK_MEMBERS]] for t in "abc"]
    assert packs == [[0], [1, 2], [3]]  # the two that share one are packed together
    assert searcher.suggest("d") == searcher.FINISHED


@pytest.mark.parametrize("change,message", [
    ({"sampler": "grid", "params": {"optimizer": {"type": "categorical", "choices": ["adam", "sgd"],
                                                  "target": "train.optimizer.name"}}, "trials": 2},
     "a grid sampler sets categorical parameters only"),
    ({"params": {"optimizer": {"type": "categorical", "choices": ["adam", "sgd"],
                               "target": "train.optimizer.name"}}}, "no searched parameter may differ"),
    ({"params": {"batch": {"type": "int", "low": 8, "high": 64, "target": "train.batch_size"}}},
     "no searched parameter may differ"),
    ({"task": {"kind": "sequence_arithmetic", "operation": "sum"}, "fixed": {"device": "cpu"}},
     "recurrent tasks train alone"),
    ({"pack": 1001}, "pack"),
    ({"pack": 1000, "seeds": 11}, "pack × seeds (1000 × 11) must be ≤ 10000"),
])
def test_a_pack_the_space_cannot_use_is_a_clear_error(change, message):
    with pytest.raises(SearchSpaceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _space(**change)


def test_what_may_differ_within_a_pack_and_the_default_is_unchanged():
    space = _space(params={
        "lr": {"type": "loguniform", "low": 1e-3, "high": 1.0, "target": "train.optimizer.lr"},
        "optimizer": {"type": "categorical", "choices": ["adam", "sgd"], "target": "train.optimizer.name"},
        "momentum": {"type": "uniform", "low": 0.5, "high": 0.9, "target": "train.optimizer.momentum",
                     "when": {"optimizer": "sgd"}},
        "lambda_max": {"type": "loguniform", "low": 0.01, "high": 1, "target": ["train.regularizer.lambda_max",
                                                                              "train.clip.max"]},
        "t_end": {"type": "int", "low": 160, "high": 190, "target": "train.regularizer.t_end",
                  "when": {"lr": 0.5}},  # its presence would depend on a packable value: fixed
    })
    assert packable_params(space) == {"lr", "momentum"}
    assert '"pack": 3' in space.spec_json()
    assert '"pack"' not in _space(pack=1).spec_json()  # spaces from before packing keep their hash


@pytest.mark.parametrize("path", [p for p in sorted(SPACES.glob("*.yaml")) if "pack:" in p.read_text()],
                         ids=lambda p: p.stem)
def test_the_packs_of_a_shipped_space_share_their_structure(path, tmp_path):
    """Every pack the searcher builds is full: no member had to be set aside because its
    run configs' `structure_key` differs from its first member's."""
    space = load_space(path)
    assert space.pack > 1
    searcher = _searcher(space, f"sqlite:///{tmp_path / 'optuna.db'}", planned=3 * space.pack)
    for trial_id in "abc":
        members = searcher.suggest(trial_id)[PACK_MEMBERS]
        assert len(members) == space.pack
        assert len({structure_key(c) for m in members for c in m[RUN_CONFIGS].values()}) == len(space.task_configs())
        for name in set(space.params) - packable_params(space):
            assert len({str(m["params"].get(name)) for m in members}) == 1, name
    assert searcher.suggest("d") == searcher.FINISHED
