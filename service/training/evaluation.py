"""The evaluation half of the trainer: per-seed MSEs on the shared evaluation sets, the
history of evaluations, and each seed's best-validation state (`Trainer` mixes this in).

A seed's MSE never depends on how many seeds train beside it: every evaluation tile has
the same `EVAL_CHUNK` samples whatever S (a matmul's result can depend on its row count),
and tile sums are added per seed in sample order, in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from service.native.ordered import tree_sum
from service.scoring.metrics import EvalHistory
from service.units.base import ForwardContext

if TYPE_CHECKING:
    from service.training.checkpoint import TrainerCheckpoint

EVAL_ELEMENTS = 1 << 22  # per evaluation tile: seeds × samples × widest layer input
EVAL_CHUNK = 512  # samples per evaluation tile: fixed, so a seed's MSE never depends on S


@dataclass
class EvalReport:
    """What the trainer tells a listener at each evaluation (progress bars, Ray Tune)."""

    step: int
    total_steps: int
    interpolation_mse: np.ndarray  # [S]
    extrapolation_mse: dict[str, np.ndarray]  # name -> [S]
    diverged: np.ndarray  # [S] bool
    history: EvalHistory
    elapsed_s: float
    checkpoint: TrainerCheckpoint | None = None  # set every `checkpoint_every` evaluations


class Evaluation:
    """Evaluation of a `Trainer` (its model, task, evaluation sets and per-seed state)."""

    @torch.no_grad()
    def _mse(self, x: Tensor, y: Tensor) -> Tensor:
        """Per-seed MSE ``[S]`` of the model on a shared evaluation set.

        Evaluated in tiles of `EVAL_CHUNK` samples × a group of seeds (as many as fit
        `EVAL_ELEMENTS`; a group runs the model on its slice of the parameters). A seed's
        numbers never depend on how many seeds are trained: every tile has the same
        samples whatever S (a matmul's result can depend on its row count), each tile's
        squared errors are summed per seed and the tile sums added in sample order, in
        float64.
        """
        was_training = self.model.training
        self.model.eval()
        n, S = x.shape[0], self.num_seeds
        width = max(self.task.input_size, self.config.model.hidden_size) * max(1, self.task.output_size)
        group = max(1, min(S, EVAL_ELEMENTS // (EVAL_CHUNK * width)))
        params = dict(self.model.named_parameters())
        total = torch.zeros(S, dtype=torch.float64, device=self.device)
        for s0 in range(0, S, group):
            s1 = min(S, s0 + group)
            keys = self.noise_keys[s0:s1]
            ctx = ForwardContext(step=self.step_t, noise_keys=keys)
            sliced = {k: v[s0:s1] for k, v in params.items()}
            for i in range(0, n, EVAL_CHUNK):
                xb = x[i:i + EVAL_CHUNK]  # shared by every seed: seed stride 0, even for one seed
                xb = xb.as_strided((s1 - s0, *xb.shape), (0, *xb.stride()))
                z = self.model(xb, ctx) if group >= S else torch.func.functional_call(self.model, sliced, (xb, ctx))
                yb = y[..., i:i + EVAL_CHUNK, :]  # [chunk, O] shared, or [T, chunk, O] by task
                if yb.dim() == 3:  # members of mixed targets: each seed its task's row
                    yb = yb.index_select(0, self.eval_task_rows[s0:s1])
                err = (z - yb).double().square()
                # a CPU sums a row of a tile in one order whatever the rows; a GPU's kernel
                # splits it by the number of rows (the group's seeds): `tree_sum` there
                total[s0:s1] += err.flatten(1).sum(1) if err.is_cpu else tree_sum(err.flatten(1))
        self.model.train(was_training)
        return total / (n * y.shape[-1])

    def evaluate(self) -> None:
        self._steps.append(self.step)
        engine = getattr(self, "engine", None)
        if engine is not None:  # its weights and masks, for the sparsity and divergence checks
            engine.write_back(optimizer=False)
        for name, (x, y) in self.eval_sets.items():
            mse = self._mse(x, y) if engine is None else engine.mse(name)
            if name == "interpolation":
                self._interp.append(mse)
            else:
                self._extrap[name].append(mse)
        self._track_best(self._interp[-1])

    @torch.no_grad()
    def _track_best(self, interpolation_mse: Tensor) -> None:
        """Keep, per seed, the sparsity error of the weights at the evaluation with the lowest
        interpolation MSE so far: masks over the seeds, the same choice as `per_seed_metrics`
        makes from the history (the first evaluation always counts, a strictly lower MSE
        replaces it, NaN ranks as +inf)."""
        mse = torch.where(torch.isnan(interpolation_mse), float("inf"), interpolation_mse)
        improved = mse < self.best_interpolation_mse
        if len(self._steps) == 1:
            improved = torch.ones_like(improved)
        sparsity = self.model.sparsity_error().detach().to(torch.float64)
        self.best_interpolation_mse.copy_(torch.where(improved, mse, self.best_interpolation_mse))
        self.best_step.masked_fill_(improved, self.step)
        self.best_sparsity_error.copy_(torch.where(improved, sparsity, self.best_sparsity_error))

    def history(self) -> EvalHistory:
        return EvalHistory(
            steps=np.asarray(self._steps, dtype=np.int64),
            interpolation_mse=torch.stack(self._interp).cpu().numpy(),
            extrapolation_mse={n: torch.stack(v).cpu().numpy() for n, v in self._extrap.items()},
        )
