"""Packed runs: K configurations that share a structure trained together (STAND-IN).

THIS MODULE IS A STAND-IN, written for the sweep side (`service.sweep.pack`) so that it
can be built and tested before the real seed-batched implementation lands. It has the
real module's interface exactly (`packable_path`, `structure_key`, `packable`,
`MemberEval`, `PackedTrainer`), but `PackedTrainer` here trains K separate `Trainer`s
advanced in lockstep from one evaluation to the next, not one computation of K × S seeds.
A member's numbers are therefore trivially those of its configuration trained alone.
It holds no sweep logic; the real file replaces it as a whole.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from service.config import RunConfig
from service.scoring.metrics import AggregateMetrics, aggregate, per_seed_metrics
from service.training.checkpoint import TrainerCheckpoint
from service.training.evaluation import EvalReport
from service.training.result import RunResult
from service.training.trainer import Trainer

_OPTIMIZER = frozenset({"lr", "lr_min", "betas", "eps", "momentum", "alpha"})
_REGULARIZER = frozenset({"lambda_max", "t_start", "t_end", "oob"})
_OPTIONS = frozenset({"tau_start", "tau_end", "tau_t0", "tau_t1", "tau_min", "tau_rate", "gate_bias_init",
                      "gate_init"})
_LAYER_OPTION = re.compile(r"^model\.layers\.(\d+|\*)\.options\.(\w+)$")


def packable_path(path: str) -> bool:
    """True if a run-config dotted path is a continuous setting that may differ between
    the members of one pack."""
    parts = path.split(".")
    if len(parts) == 3 and parts[:2] == ["train", "optimizer"]:
        return parts[2] in _OPTIMIZER
    if len(parts) == 3 and parts[:2] == ["train", "regularizer"]:
        return parts[2] in _REGULARIZER
    m = _LAYER_OPTION.match(path)
    return bool(m) and m.group(2) in _OPTIONS


def packable(config: RunConfig) -> bool:
    """Recurrent tasks are never packed."""
    return not getattr(config.task, "recurrent", False)


def structure_key(config: RunConfig) -> str:
    """Configs with equal keys can train in one pack: SHA-256 of the config without its
    packable fields; a recurrent config's key is unique to it."""
    data = config.model_dump(mode="json")
    if not packable(config):
        return "recurrent:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    train = data.get("train") or {}
    for section, fields in (("optimizer", _OPTIMIZER), ("regularizer", _REGULARIZER)):
        for name in fields:
            if isinstance(train.get(section), dict):
                train[section].pop(name, None)
    for layer in (data.get("model") or {}).get("layers") or []:
        for name in _OPTIONS:
            layer.get("options", {}).pop(name, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass
class MemberEval:
    """One member's evaluation within a pack."""

    index: int  # the member's position in the pack, stable after others are dropped
    report: EvalReport  # this member's seeds only; ``report.checkpoint`` its own when due
    aggregate: AggregateMetrics  # partial aggregate of the member so far
    thresholds: dict[str, float]


class PackedTrainer:
    """K configurations of one structure, trained together; members can be dropped."""

    def __init__(self, configs: Sequence[RunConfig]) -> None:
        if len({structure_key(c) for c in configs}) > 1:
            raise ValueError("the configurations of a pack must share their structure (structure_key)")
        self.configs = tuple(configs)
        self.active: list[int] = list(range(len(self.configs)))
        self._trainers = [Trainer(c) for c in self.configs]

    def drop(self, members: Iterable[int]) -> None:
        gone = set(members)
        self.active = [i for i in self.active if i not in gone]

    def run(self, on_eval: Callable[[list[MemberEval]], None] | None = None, *,
            resume_from: Sequence[TrainerCheckpoint | None] | None = None,
            checkpoint_every: int = 0) -> list[RunResult | None]:
        """Train every active member to ``train.steps`` (as `Trainer.run`)."""
        t = self.configs[0].train
        before = [0.0] * len(self._trainers)
        evaluated_at = None
        for i, ckpt in enumerate(resume_from or []):
            if ckpt is not None:
                self._trainers[i].load_checkpoint(ckpt)
                before[i] = ckpt.elapsed_s
                evaluated_at = ckpt.eval_steps[-1] if ckpt.eval_steps else None
        for trainer in self._trainers:
            trainer.model.train()
        started = time.perf_counter()
        step = self._trainers[0].step
        while True:
            if (step % t.eval_every == 0 or step == t.steps) and step != evaluated_at:
                evals = [self._evaluate(i, before[i] + time.perf_counter() - started, checkpoint_every)
                         for i in self.active]
                if on_eval is not None and evals:
                    on_eval(evals)
            if step >= t.steps or not self.active:
                break
            every = [t.eval_every] + ([t.reinit.every] if t.reinit.enabled else [])
            stop = min([t.steps] + [(step // k + 1) * k for k in every])
            for i in self.active:
                self._trainers[i].maybe_reinitialise()
                self._trainers[i].train_steps(stop - step)
            step = stop
        elapsed = time.perf_counter() - started
        return [self._trainers[i].result(before[i] + elapsed) if i in self.active and step >= t.steps else None
                for i in range(len(self._trainers))]

    def _evaluate(self, i: int, elapsed_s: float, checkpoint_every: int) -> MemberEval:
        trainer, t = self._trainers[i], self.configs[i].train
        trainer.evaluate()
        with torch.no_grad():  # what `Trainer.run` does after each evaluation
            finite = torch.stack([torch.isfinite(p).flatten(1).all(1) for p in trainer.params]).all(0)
            trainer.diverged_at.copy_(torch.where(trainer.alive & ~finite, trainer.step, trainer.diverged_at))
            trainer.alive.logical_and_(finite)
        history = trainer.history()
        diverged = (~trainer.alive).cpu().numpy()
        step = trainer.step
        wanted = (checkpoint_every > 0 and 0 < step < t.steps and step % t.eval_every == 0
                  and (step // t.eval_every) % checkpoint_every == 0)
        report = EvalReport(
            step=step, total_steps=t.steps, interpolation_mse=history.interpolation_mse[-1],
            extrapolation_mse={n: v[-1] for n, v in history.extrapolation_mse.items()},
            diverged=diverged, history=history, elapsed_s=elapsed_s,
            checkpoint=trainer.checkpoint(elapsed_s) if wanted else None,
        )
        final = trainer.model.sparsity_error().detach().cpu().numpy()
        seeds = per_seed_metrics(history, trainer.thresholds, trainer.best_sparsity_error.cpu().numpy(), diverged,
                                 None, trainer.seed_ids, final_sparsity_error=final)
        return MemberEval(index=i, report=report, aggregate=aggregate(seeds), thresholds=trainer.thresholds)
