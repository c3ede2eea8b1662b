"""Packed runs: the seeds of K configurations of one structure trained as one computation.

A sweep's trial trains S seeds; on a GPU (and, less so, on a CPU) S = 16 leaves most of the
device idle. A `PackedTrainer` trains K such trials as one seed batch of K × S seeds, each
member with its own continuous settings as per-seed rows (`service.training.seed_settings`)
and its own master seed and seed ids. Since no operation mixes seeds, a member trains
bit-identically to the same configuration alone: its metrics, history, checkpoints and
final parameters are those of ``Trainer(member).run()``.

A member can be dropped (a pruned trial): the pack is rebuilt without its seeds from a
checkpoint of the others, which continue as they would have.

A compiled pack pads its seed dimension to the next power of two (`seed_bucket`) with
*padding rows*: copies of its members' leading seeds (same configuration, same seed ids),
trained and discarded. A compiled step is specialised to its shapes, so without padding a
pack of another size (a member dropped, the sweep's next pack) would compile again; padded,
every pack of one bucket reuses the compiled step (on a GPU only the CUDA graph is captured
again, a fraction of a second). No operation mixes seeds, so a real seed's trajectory is
the same padded or not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

from service.config import RunConfig
from service.pack_structure import check_pack, packable
from service.scoring.metrics import AggregateMetrics, aggregate, per_seed_metrics
from service.training.checkpoint import TrainerCheckpoint, config_fingerprint, pack_fingerprint
from service.training.evaluation import EvalReport
from service.training.result import RunResult
from service.training.device import compile_mode
from service.training.trainer import Trainer

__all__ = ["MemberEval", "PackedTrainer", "merge_checkpoints", "padding_members", "seed_bucket", "split_checkpoint"]


@dataclass
class MemberEval:
    """One member's view of an evaluation of the pack."""

    index: int  # the member's position in the pack, stable when others are dropped
    report: EvalReport  # this member's seeds only; ``checkpoint`` is the member's own
    aggregate: AggregateMetrics  # the member's partial aggregate so far
    thresholds: dict[str, float]


_PER_SEED = ("optimizer_steps", "alive", "diverged_at", "best_loss", "last_improved",
             "best_interpolation_mse", "best_step", "best_sparsity_error")


def split_checkpoint(ckpt: TrainerCheckpoint, members: Sequence[RunConfig]) -> list[TrainerCheckpoint]:
    """A pack's checkpoint cut into its members' (each what the member alone would write)."""
    out, start = [], 0
    for member in members:
        rows = slice(start, start + member.seeds)
        start += member.seeds
        out.append(dataclasses.replace(
            ckpt, config_fingerprint=config_fingerprint(member), seed_ids=ckpt.seed_ids[rows],
            model={k: v[rows].clone() for k, v in ckpt.model.items()},
            optimizer_powers=ckpt.optimizer_powers[:, rows].clone(),
            optimizer_state=tuple(tuple(b[rows].clone() for b in st) for st in ckpt.optimizer_state),
            reinit_counts=ckpt.reinit_counts[rows],
            interpolation_mse=ckpt.interpolation_mse[:, rows].clone(),
            extrapolation_mse={n: v[:, rows].clone() for n, v in ckpt.extrapolation_mse.items()},
            **{name: getattr(ckpt, name)[rows].clone() for name in _PER_SEED},
        ))
    if start != len(ckpt.seed_ids):
        raise ValueError(f"the members have {start} seeds, the checkpoint {len(ckpt.seed_ids)}")
    return out


def merge_checkpoints(parts: Sequence[TrainerCheckpoint], members: Sequence[RunConfig]) -> TrainerCheckpoint:
    """The members' checkpoints (all at one step) as one checkpoint of their pack."""
    first = parts[0]
    if len({p.step for p in parts}) > 1 or len({p.eval_steps for p in parts}) > 1:
        raise ValueError("members checkpointed at different steps cannot be packed together")

    def cat(name: str, dim: int = 0) -> torch.Tensor:
        return torch.cat([getattr(p, name) for p in parts], dim)

    return dataclasses.replace(
        first, config_fingerprint=pack_fingerprint(members),
        seed_ids=tuple(s for p in parts for s in p.seed_ids),
        elapsed_s=max(p.elapsed_s for p in parts),
        model={k: torch.cat([p.model[k] for p in parts]) for k in first.model},
        optimizer_powers=cat("optimizer_powers", 1),
        optimizer_state=tuple(tuple(torch.cat([p.optimizer_state[i][j] for p in parts])
                                    for j in range(len(st))) for i, st in enumerate(first.optimizer_state)),
        reinit_counts=tuple(c for p in parts for c in p.reinit_counts),
        interpolation_mse=cat("interpolation_mse", 1),
        extrapolation_mse={n: torch.cat([p.extrapolation_mse[n] for p in parts], 1) for n in first.extrapolation_mse},
        **{name: cat(name) for name in _PER_SEED},
    )


def seed_bucket(seeds: int) -> int:
    """The seed rows a compiled pack of ``seeds`` seeds trains: the next power of two."""
    return 1 << max(0, seeds - 1).bit_length()


def padding_members(members: Sequence[RunConfig], rows: int) -> list[RunConfig]:
    """Configurations filling a pack of ``members`` up to ``rows`` seed rows: each a copy
    of a member (in turn) with its first seeds, so its seeds are ones the pack already
    trains (their duplicates are trained and discarded)."""
    out, missing, i = [], rows - sum(m.seeds for m in members), 0
    while missing > 0:
        m = members[i % len(members)]
        take = min(missing, m.seeds)
        out.append(m.model_copy(update={"seeds": take}))
        missing, i = missing - take, i + 1
    return out


def _padding_checkpoints(parts: Sequence[TrainerCheckpoint], members: Sequence[RunConfig],
                         padding: Sequence[RunConfig]) -> list[TrainerCheckpoint]:
    """The checkpoints of ``padding`` (`padding_members` of ``members``) cut from the
    members' own ``parts``: a padding config's seeds are its member's first seeds."""
    out = []
    for i, pad in enumerate(padding):
        m, part = members[i % len(members)], parts[i % len(members)]
        rest = m.model_copy(update={"seeds": m.seeds - pad.seeds, "seed_offset": m.seed_offset + pad.seeds})
        out.append(part if pad.seeds == m.seeds else split_checkpoint(part, [pad, rest])[0])
    return out


class _Repack(Exception):
    """Raised out of `Trainer.run` to rebuild the pack without dropped members."""

    def __init__(self, parts: list[TrainerCheckpoint]) -> None:
        super().__init__("repack")
        self.parts = parts


class PackedTrainer:
    """Trains the members ``configs`` (one structure: `check_pack`) as one seed batch."""

    def __init__(self, configs: Sequence[RunConfig], prepare: Callable[[Trainer], object] | None = None) -> None:
        """``prepare``: called with each `Trainer` built for the pack (e.g. to attach the
        device engine, `service.engine.attach_on_gpu`), before it trains."""
        self.configs = tuple(configs)
        self.prepare = prepare
        check_pack(self.configs)
        self.active: list[int] = list(range(len(self.configs)))
        self._dropping: set[int] = set()
        self.trainer: Trainer | None = None
        self.padding: list[RunConfig] = []  # the current trainer's padding rows (`padding_members`)

    def drop(self, members: Iterable[int]) -> None:
        """Stop training ``members`` (their seeds leave the batch at this evaluation)."""
        self._dropping.update(m for m in members if m in self.active)

    def run(self, on_eval: Callable[[list[MemberEval]], None] | None = None, *,
            resume_from: Sequence[TrainerCheckpoint | None] | None = None,
            checkpoint_every: int = 0) -> list[RunResult | None]:
        """Train every member to the end, as `Trainer.run` does for one (``resume_from``:
        one checkpoint per member, all at one step, or None for all)."""
        results: list[RunResult | None] = [None] * len(self.configs)
        parts: list[TrainerCheckpoint] | None = None  # the active members', to start from
        if resume_from is not None and any(c is not None for c in resume_from):
            if any(c is None for c in resume_from):
                raise ValueError("resume every member of a pack from a checkpoint, or none")
            parts = list(resume_from)  # type: ignore[arg-type]
        padded = packable(self.configs[0]) and compile_mode(self.configs[0]) == "compiled"
        while self.active:
            members = [self.configs[i] for i in self.active]
            self.padding = padding_members(members, seed_bucket(sum(m.seeds for m in members))) if padded else []
            start = None
            if parts is not None:
                start = merge_checkpoints(parts + _padding_checkpoints(parts, members, self.padding),
                                          members + self.padding)
            if self.trainer is not None:
                self.trainer.release_graph()  # destroyed now, never inside another capture
            self.trainer = Trainer(members[0], members=members + self.padding)
            if self.prepare is not None:
                self.prepare(self.trainer)
            try:
                result_all = self.trainer.run(self._listener(on_eval), resume_from=start,
                                              checkpoint_every=checkpoint_every)
            except _Repack as repack:
                kept = [i for i in self.active if i not in self._dropping]
                parts = [repack.parts[self.active.index(i)] for i in kept]
                self.active, self._dropping = kept, set()
                continue
            for pos, index in enumerate(self.active):
                if index not in self._dropping:
                    results[index] = self.trainer.result(result_all.elapsed_s, pos)
            break
        return results

    def _listener(self, on_eval: Callable[[list[MemberEval]], None] | None) -> Callable[[EvalReport], None]:
        def listener(report: EvalReport) -> None:
            trainer = self.trainer
            assert trainer is not None
            members = [self.configs[i] for i in self.active]
            if on_eval is not None:
                on_eval(self._member_evals(trainer, report, members))
            if self._dropping and report.step < report.total_steps:
                ckpt = report.checkpoint or trainer.checkpoint(report.elapsed_s)
                raise _Repack(split_checkpoint(ckpt, members + self.padding)[:len(members)])

        return listener

    def _member_evals(self, trainer: Trainer, report: EvalReport, members: list[RunConfig]) -> list[MemberEval]:
        parts = (split_checkpoint(report.checkpoint, members + self.padding)
                 if report.checkpoint is not None else None)
        sparsity = trainer.model.sparsity_error().detach().cpu().numpy()
        best = trainer.best_sparsity_error.cpu().numpy()
        out = []
        for pos, (index, rows) in enumerate(zip(self.active, trainer.settings.slices)):
            history = report.history.seeds(rows)
            diverged = report.diverged[rows]
            thresholds = trainer.member_thresholds[pos]
            seeds = per_seed_metrics(history, thresholds, best[rows], diverged, None,
                                     trainer.seed_ids[rows], final_sparsity_error=sparsity[rows],
                                     prerequisites=trainer.task.range_prerequisites())
            out.append(MemberEval(
                index=index, thresholds=thresholds, aggregate=aggregate(seeds),
                report=dataclasses.replace(
                    report, interpolation_mse=report.interpolation_mse[rows],
                    extrapolation_mse={n: v[rows] for n, v in report.extrapolation_mse.items()},
                    diverged=diverged, history=history,
                    checkpoint=parts[pos] if parts is not None else None),
            ))
        return out
