"""The seed-batched trainer for recurrent tasks (`service.tasks.sequence`).

The same loop, optimiser, divergence masks, re-initialisation, checkpoints and metrics as
`Trainer`; what differs is the model (a read-out and a recurrent cell unrolled over the
sequence for all S seeds at once, `service.training.recurrent_model`), the batch (each
seed's own sequences, from its counter-based data stream), the R_z regulariser on the
cell's inputs, and evaluation: every test length (the cell on the seed's own read-out) and
the read-out's accuracy are read from ONE pass over sequences of the longest length,
without autograd, in chunks of positions (the state is carried between chunks, so a
length-1000 evaluation never holds 1000 steps of activations). Image tasks run the
read-out once per distinct image, not once per position.

The training step (read-out, the cell unrolled over the training length, gradient and
update) compiles like a static task's: the training length is fixed, so it is traced once.
``compile: auto`` compiles it on a GPU, where an eager step is launch-bound (hundreds of
small kernels), and captures it in CUDA graphs; on a CPU ``auto`` keeps it eager (``on``
compiles there too). Evaluation, over many lengths in chunks, stays eager.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from service.config import RunConfig
from service.native.ordered import tree_sum
from service.tasks import SequenceSet, SequenceTask
from service.training.device import compile_pays_off
from service.training.trainer import Trainer
from service.units.base import ForwardContext
from service.units.schedule import RegularizerSchedule

# per evaluation chunk and seed: sequences × positions × width. The chunk's positions never
# depend on the seed count (a product's rounding can depend on its row count), and the
# metrics are summed by `tree_sum`, in an order fixed by the sequences and positions alone.
_EVAL_ELEMENTS_PER_SEED = 1 << 16
PAPER_STEPS = 5_000_000
"""The reference schedules are for 5e6-step runs; a shorter run without an explicit
schedule gets the same fractions of its own length."""


def recurrent_schedules(config: RunConfig) -> tuple[RegularizerSchedule, RegularizerSchedule]:
    """``(sparsity schedule, R_z schedule)``. Without ``train.regularizer`` the reference
    default is scaled to the run's length when it would not start within it; without
    ``train.regularizer_z`` R_z has λ_z = 1 on the sparsity schedule's warm-up."""
    schedule = config.regularizer()
    steps = config.train.steps
    if config.train.regularizer is None and schedule.t_start >= steps:
        scale = steps / PAPER_STEPS
        schedule = schedule.model_copy(update={"t_start": int(schedule.t_start * scale),
                                               "t_end": max(int(schedule.t_end * scale), int(schedule.t_start * scale) + 1)})
    z = config.train.regularizer_z
    if z is None:
        z = schedule.model_copy(update={"lambda_max": 1.0, "oob": 0.0})
    return schedule, z


class RecurrentTrainer(Trainer):
    """Trains ``config.seeds`` seeds of a recurrent configuration as one computation."""

    task: SequenceTask

    @classmethod
    def trains(cls, config: RunConfig) -> bool:
        return bool(getattr(config.task, "recurrent", False))

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.schedule, self.z_schedule = recurrent_schedules(config)
        self.sequence_sets = self.task.sequence_sets(self.device)
        self.extrapolation_names = self.task.extrapolation_names()
        self._extrap = {n: [] for n in self.extrapolation_names}
        self.lengths = dict(zip(self.extrapolation_names, self.task.test_lengths))
        self.train_data = self.task.train_data(self.device)

    def _compile_pays_off(self) -> bool:
        return compile_pays_off(self.device, self.config.train.steps, recurrent=True)

    def _fuses_first_layer(self) -> bool:
        return False  # sequences: the read-in layer sees each position, not a drawn batch

    # -- the step ---------------------------------------------------------------------------
    def _batch(self, step: Tensor) -> tuple[Tensor, Tensor]:
        """Each seed's sequences ``x [S, B, L, I]`` and running targets ``[S, B, L, 1]``."""
        t = self.config.train
        keys = self.data_keys[:1] if t.shared_batch else self.data_keys
        x, target = self.task.train_batch(keys, step, t.batch_size, self.train_data)
        if t.shared_batch:
            x = x.expand(self.num_seeds, *x.shape[1:])
            target = target.expand(self.num_seeds, *target.shape[1:])
        return x, target

    def _loss_eager(self, step: Tensor) -> tuple[Tensor, Tensor]:
        x, target = self._batch(step)
        ctx = ForwardContext(step=step, noise_keys=self.noise_keys)
        y, cell_inputs = self.model.forward_with_inputs(x, ctx)
        if self.config.train.loss == "mse":
            task_loss = (y - target).square().flatten(1).mean(1)
        else:
            task_loss = torch.nn.functional.smooth_l1_loss(y, target, reduction="none").flatten(1).mean(1)
        total = task_loss + self.schedule.value(step) * self.model.regularizer()
        if self.z_schedule.lambda_max > 0:
            total = total + self.z_schedule.value(step) * self.model.z_regularizer(cell_inputs)
        if self.schedule.oob > 0:
            total = total + self.schedule.oob * self.model.oob_penalty()
        return total.sum(), task_loss.detach()

    # -- evaluation ---------------------------------------------------------------------------
    def _shared(self, x: Tensor) -> Tensor:
        """``x`` seen by every seed (seed stride 0, even for one seed)."""
        return x.as_strided((self.num_seeds, *x.shape), (0, *x.stride()))

    @torch.no_grad()
    def sequence_mse(self, data: SequenceSet, own_readout: bool = False) -> Tensor:
        """Per-seed MSE at each scored length ``[S, len(data.lengths)]`` (float64) against
        the targets; with ``own_readout`` the cell's against the exact running result (in
        float64) of the values the seed's own read-out produced (the step operands when the
        model has no read-out), and one more column: the read-out's per-step MSE against the
        step operands over every position (`service.tasks.sequence`)."""
        was_training = self.model.training
        self.model.eval()
        ctx = ForwardContext(step=self.step_t, noise_keys=self.noise_keys)
        n = data.inputs.shape[0]
        last = max(data.lengths.values())
        columns = {length - 1: j for j, length in enumerate(data.lengths.values())}
        out = torch.zeros(self.num_seeds, len(columns) + own_readout, dtype=torch.float64, device=self.device)
        table_z = None if data.table is None else self.model.read(self._shared(data.table), ctx)
        width = max(self.task.input_size, self.config.model.hidden_size, 2)
        chunk = max(1, _EVAL_ELEMENTS_PER_SEED // max(1, n * width))  # never from S
        has_readout = len(self.model.units) > 1
        state: Any = None
        running = torch.full((self.num_seeds, n, 1), self.task.start_state, dtype=torch.float64, device=self.device)
        for start in range(0, last, chunk):
            end = min(last, start + chunk)
            if table_z is not None:
                z = table_z[:, data.inputs[:, start:end]]
            else:
                x = data.features(start, end)
                z = self.model.read(self._shared(x.reshape(-1, x.shape[-1])), ctx).view(self.num_seeds, n, end - start, -1)
            y, state, _ = self.model.run(z, state, ctx)
            reference = data.targets[:, start:end].expand(self.num_seeds, n, end - start)
            if own_readout:
                operands = data.operands[:, start:end]
                values = z[..., 0].double() if has_readout else operands.expand_as(reference)
                out[:, -1] += tree_sum((values - operands).square().flatten(1))
                reference = (running + values.cumsum(2) if self.task.operation == "sum"
                             else running * values.cumprod(2))
                running = reference[:, :, -1:]
            for p in range(start, end):
                if p in columns:
                    err = (y[:, :, p - start, 0].double() - reference[:, :, p - start]).square()
                    out[:, columns[p]] = tree_sum(err) / err.shape[1]
        if own_readout:
            out[:, -1] /= n * last
        self.model.train(was_training)
        return out

    def evaluate(self) -> None:
        self._steps.append(self.step)
        self._interp.append(self.sequence_mse(self.sequence_sets["interpolation"])[:, 0])
        test = self.sequence_mse(self.sequence_sets["test"], own_readout=True)
        for j, name in enumerate(self.extrapolation_names):  # the test lengths, then the read-out
            self._extrap[name].append(test[:, j])
        self._track_best(self._interp[-1])
