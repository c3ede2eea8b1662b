"""How a training step gets its batch: each seed's inputs and targets, drawn on the
interpolation range from the seed's own data stream (`service.seeding.generator.sample`),
and where the structure allows it the first layer's output with them, drawn and applied
seed tile by seed tile (`service.units.sampled_linear`). A mixin of `Trainer`."""

from __future__ import annotations

import torch
from torch import Tensor

from service.seeding import generator as rng
from service.units import sampled_linear


class TrainingBatches:
    """`Trainer`'s batches (its attributes: config, task, model, keys, member tasks)."""

    def _batch(self, step: Tensor) -> tuple[Tensor, Tensor]:
        """Each seed's inputs ``x [S, B, I]`` and targets for ``step``.

        One pass of `rng.sample` draws x on the interpolation range and, for tasks whose
        operands are sums of runs of inputs, those sums (the target then needs no second
        read of x). Eager on CPU, x is written into a buffer kept across steps (no fresh
        multi-MB allocation per step): it stays valid until the next call.
        """
        x, target, _ = self._batch_and_first_layer(step, None)
        return x, target

    def _fuses_first_layer(self) -> bool:
        """Whether a step draws its batch and applies the first layer in one pass
        (`sampled_linear`, the same bits as one after the other): the first unit is a plain
        product ``W x`` and the batch is per seed, on a CPU in float32. From the structure
        alone, never from the number of seeds."""
        units = getattr(self.model, "units", None)
        w = units[0].input_product_weight() if units else None
        t = self.config.train
        return (w is not None and not t.shared_batch and self.dtype == torch.float32 and self.device.type == "cpu"
                and sampled_linear.usable(self.data_keys, w, (t.batch_size, self.task.input_size),
                                          self.task.interpolation.intervals))

    def _batch_and_first_layer(self, step: Tensor, w: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """`_batch`'s ``x`` and targets; with the first layer's weight ``w`` (where
        `_fuses_first_layer`), also that layer's output ``x wᵀ``, drawn and applied seed tile
        by seed tile (`sampled_linear.sample_linear`)."""
        t = self.config.train
        shape = (t.batch_size, self.task.input_size)
        keys = self._shared_keys if t.shared_batch else self.data_keys
        runs = self.task.operand_runs() or ()
        buffers = self._batch_buffers(keys.shape[0], shape, len(runs))
        if w is None:
            x, sums = rng.sample(keys, step, shape, self.task.interpolation.intervals, runs, out=buffers)
            z = None
        else:
            x, sums, z = sampled_linear.sample_linear(keys, step, shape, self.task.interpolation.intervals, runs,
                                                      w, out=buffers)
        tasks = self.member_tasks
        if t.shared_batch and self._seed_member is not None:  # a pack: each seed its member's batch
            x, sums = x[self._seed_member], sums[self._seed_member]
        if self.dtype != x.dtype:  # float64: the float32 draw, its target computed in float64
            x = x.to(self.dtype)
            target = tasks.targets(lambda task, rows: task.target(rows), x)
        elif runs:
            target = tasks.targets(lambda task, rows: task.apply_operation(rows), sums)
        else:
            target = tasks.targets(lambda task, rows: task.target(rows), x)
        if t.shared_batch and keys.shape[0] == 1:
            x = x.expand(self.num_seeds, *shape)
            target = target.expand(self.num_seeds, *target.shape[1:])
        return x, target, z

    def _batch_buffers(self, rows: int, shape: tuple[int, int], k: int) -> tuple[Tensor, Tensor] | None:
        if self.device.type != "cpu" or torch.compiler.is_compiling():
            return None
        if self._buffers is None:
            self._buffers = (torch.empty(rows, *shape), torch.empty(rows, shape[0], k))
        return self._buffers
