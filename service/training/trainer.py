"""The seed-batched trainer.

One step draws each seed's own batch (counter-based, per-seed keys), runs one
forward/backward for all S seeds and updates them; per-seed concerns (gradient-norm
clipping, divergence, re-initialisation) are masks over the seed dimension, so no Python
runs per seed per step. The host only synchronises at evaluation steps. At evaluations a
run can hand out a `TrainerCheckpoint` and continue from one bit for bit
(`service.training.checkpoint`).

Speed (CPU, one thread, 100 seeds, NAU → NMU on the 100-input task): a run the native
CPU step covers trains in it (`service.training.cpu_step`: every step to the next
evaluation in one C call, seed by seed, with this step's eager bits); otherwise the batch, its
interpolation-range map and the target's operand sums come from one native pass
(`service.seeding.generator.sample`), which also applies a plain first layer (NAU,
linear) seed tile by seed tile while the tile's batch is in cache
(`service.units.sampled_linear`: the same bits as drawing, then applying it); the narrow
linear layers and the two-input NMU have native kernels (`service.units.kernels`);
compiled, the whole step (forward, ``autograd.grad``, update) is one graph.
docs/performance.md has the measured figures.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Callable, Sequence

import torch
from torch import Tensor

from service import native
from service.config import RunConfig
from service.native.ordered import lane_sum
from service.pack_structure import check_pack, packable
from service.scoring.metrics import aggregate, per_seed_metrics
from service.seeding import InitStream, stream_keys
from service.training import cpu_step
from service.training.batches import TrainingBatches
from service.training.checkpoint import (
    TrainerCheckpoint,
    pack_fingerprint,
    params_sha256,
    restore_checkpoint,
    take_checkpoint,
)
from service.training.device import (
    compile_pays_off,
    resolve_device,
)
from service.training.evaluation import EvalReport, Evaluation
from service.training.graphs import GRAPH_STEPS, CapturedSteps
from service.training.member_tasks import MemberTasks
from service.training.model import BatchedModel, build_model
from service.training.optimizers import BatchedOptimizer
from service.training.result import RunResult
from service.training.seed_settings import SeedSchedule, SeedSettings
from service.units.base import ForwardContext



def _isfinite(t: Tensor) -> Tensor:
    """``torch.isfinite``; eager in two elementwise operations instead of four (``t − t`` is 0
    for finite t, NaN otherwise: exact in IEEE arithmetic, which compiled fast-math may not keep)."""
    if torch.compiler.is_compiling():
        return torch.isfinite(t)
    return (t - t) == 0


class Trainer(TrainingBatches, Evaluation, CapturedSteps):
    """Trains ``config.seeds`` seeds of one configuration as one batched computation."""

    def __new__(cls, config: RunConfig, *args, **kwargs):
        """The subclass that claims the task (a recurrent task's `RecurrentTrainer`, which
        the `service.training` package imports), else a `Trainer`: ``Trainer(config)`` either way."""
        if cls is Trainer:
            cls = next((sub for sub in Trainer.__subclasses__() if sub.trains(config)), cls)
        return super().__new__(cls)

    @classmethod
    def trains(cls, config: RunConfig) -> bool:
        """Whether this subclass is the trainer of ``config``'s task."""
        return False

    def __init__(self, config: RunConfig, *, members: Sequence[RunConfig] | None = None) -> None:
        """Train ``config``'s seeds; or, with ``members`` (configurations of one structure,
        `service.training.seed_settings.check_pack`), every member's seeds as one batch in
        member order, each with its own continuous settings (``config`` is the first)."""
        check_pack(members := tuple(members) if members is not None else (config,))
        self.settings, self.config = SeedSettings(members), (config := members[0])
        self.device = resolve_device(config.device)
        self.task = config.task
        self.seed_ids = [s for m in members for s in m.seed_ids]
        self.master_seeds = self.settings.per_seed(lambda m: m.master_seed)
        self.num_seeds = len(self.seed_ids)
        self.fingerprint = pack_fingerprint(members)
        t = config.train

        self.dtype = config.torch_dtype
        self.schedule = SeedSchedule(self.settings.per_seed(lambda m: m.regularizer()), self.dtype, self.device)
        self.model: BatchedModel = build_model(config, self.num_seeds).to(self.device, self.dtype)
        if packable(config):  # a recurrent model keeps its shared options
            self.model.set_seed_variants(self.settings)
        self.reinit_counts = [0] * self.num_seeds
        self._reset_positions(list(range(self.num_seeds)))
        self.model.clamp_()
        self.params = [p for p in self.model.parameters()]
        self.optimizer = BatchedOptimizer(self.params, t.optimizer, self.settings.per_seed(lambda m: m.train.optimizer))

        self.data_keys = self._stream_keys("data")
        self.fuses_first_layer = self._fuses_first_layer()
        # a shared batch is each member's own, from its first seed's stream (keys taken once);
        # in a pack of several, each seed then reads its member's batch
        slices = self.settings.slices
        self._shared_keys = self.data_keys[[r.start for r in slices]]
        self._seed_member = (torch.tensor([i for i, r in enumerate(slices) for _ in range(r.start, r.stop)],
                                          device=self.device) if len(slices) > 1 else None)
        self.noise_keys = self._stream_keys("noise")
        self.step_t = torch.zeros((), dtype=torch.int64, device=self.device)
        self.alive = torch.ones(self.num_seeds, dtype=torch.bool, device=self.device)
        self.diverged_at = torch.full((self.num_seeds,), -1, dtype=torch.int64, device=self.device)
        self.best_loss = torch.full((self.num_seeds,), float("inf"), device=self.device)
        self.last_improved = torch.zeros(self.num_seeds, dtype=torch.int64, device=self.device)
        # per seed, at its best evaluation so far (lowest interpolation MSE, the first on
        # ties; NaN ranks as +inf): that MSE, the step, and the sparsity error of that
        # step's weights (the papers' figure, `_track_best`)
        self.best_interpolation_mse = torch.full((self.num_seeds,), float("inf"), dtype=torch.float64,
                                                 device=self.device)
        self.best_step = torch.full((self.num_seeds,), -1, dtype=torch.int64, device=self.device)
        self.best_sparsity_error = torch.full((self.num_seeds,), float("nan"), dtype=torch.float64,
                                              device=self.device)
        self.step = 0
        self._elapsed_before = 0.0  # training time of earlier attempts (a resumed run)
        self._buffers: tuple[Tensor, Tensor] | None = None

        # members may differ in their target (the operation): `MemberTasks` per run of seeds
        self.member_tasks = MemberTasks.of(members)
        self.eval_sets = self.member_tasks.evaluation_sets(self.device, self.dtype)
        self.eval_task_rows = (torch.tensor(self.member_tasks.seed_task(), device=self.device)
                               if self.member_tasks.mixed else None)  # per seed, its row of y
        self.member_thresholds = self.member_tasks.thresholds()
        self.thresholds = self.member_thresholds[0]
        self.extrapolation_names = list(self.task.extrapolation)
        self._steps: list[int] = []
        self._interp: list[Tensor] = []
        self._extrap: dict[str, list[Tensor]] = {n: [] for n in self.extrapolation_names}

        use_compile = config.compile == "on" or (config.compile == "auto" and self._compile_pays_off())
        if use_compile:
            # One graph for the whole step: forward, the gradient and the update. Dynamo
            # traces `torch.autograd.grad` only with this flag (else it breaks the graph
            # there); it is read when a graph is traced, so it is set for the process (the
            # key exists from torch 2.11; an older one compiles with a graph break there).
            if hasattr(torch._dynamo.config, "trace_autograd_ops"):
                torch._dynamo.config.trace_autograd_ops = True
            # one code object for all trainers: past dynamo's 8 compilations it ran eagerly
            for key in ("recompile_limit", "accumulated_recompile_limit"):
                setattr(torch._dynamo.config, key, max(getattr(torch._dynamo.config, key), 1 << 14))
            # on CUDA torch 2.11's inductor asserted in loop reordering on a one-seed step
            options = {"loop_ordering_after_fusion": False} if self.device.type == "cuda" else None
            self._step = torch.compile(self._step_eager, dynamic=False, options=options)
            if self.device.type == "cpu":  # the graph allocates its batch afresh each step:
                native.retain_freed_memory()  # keep glibc from unmapping it (page faults)
        else:
            self._step = self._step_eager
        self.compiled = use_compile
        self._compile_pending = use_compile
        # On a GPU a compiled step costs less than its launch overhead: runs of
        # `GRAPH_STEPS` steps are captured once as one CUDA graph and replayed.
        self.graphed = use_compile and self.device.type == "cuda" and config.cuda_graphs
        self._graph: "torch.cuda.CUDAGraph | None" = None
        self.engine = None  # `service.engine.attach`: the device engine trains and evaluates instead
        # the native CPU step trains the steps of a run it covers (the eager step's bits)
        self.cpu_steps = cpu_step.CpuSteps.attach(self) if not use_compile else None

    def _compile_pays_off(self) -> bool:
        """Whether ``compile="auto"`` compiles: from the device and the run's length only
        (`compile_pays_off`) and whether the native CPU step covers it, never from the number
        of seeds or the pack."""
        return compile_pays_off(self.device, self.config.train.steps,
                                native_step=cpu_step.covers(self.config, self.device))

    def _stream_keys(self, stream: str) -> Tensor:  # [S, 3]: each member's seeds, its master seed
        return torch.cat([stream_keys(m.master_seed, stream, m.seed_ids) for m in self.settings.members]).to(self.device)

    def _reset_positions(self, positions: list[int]) -> None:
        """Re-draw ``positions``, each from its seed's Philox stream "init" or "reinit/<n>"."""
        streams: list[InitStream | None] = [None] * self.num_seeds
        for k, n in ((k, self.reinit_counts[k]) for k in positions):
            streams[k] = InitStream(self.master_seeds[k], f"reinit/{n}" if n else "init", self.seed_ids[k])
        self.model.reset_parameters(streams, positions)

    # -- the step ---------------------------------------------------------------------------
    def _loss_eager(self, step: Tensor) -> tuple[Tensor, Tensor]:
        """(Σ_seeds total loss, per-seed task loss ``[S]``) for the batch of ``step``."""
        ctx = ForwardContext(step=step, noise_keys=self.noise_keys)
        if self.fuses_first_layer:
            _, target, z = self._batch_and_first_layer(step, self.model.units[0].input_product_weight())
            y = self.model(z, ctx, start=1)
        else:
            x, target = self._batch(step)
            y = self.model(x, ctx)
        if self.config.train.loss == "mse":
            task_loss = lane_sum((y - target).square().flatten(1)) / (y.shape[1] * y.shape[2])
        else:
            task_loss = torch.nn.functional.smooth_l1_loss(y, target, reduction="none").mean((1, 2))
        total = task_loss + self.schedule.value(step, self.dtype) * self.model.regularizer()
        if self.schedule.oob_on:
            total = total + self.schedule.oob * self.model.oob_penalty()
        return total.sum(), task_loss.detach()

    def _update_eager(self, step: Tensor, task_loss: Tensor, grads: list[Tensor]) -> None:
        """Per-seed clipping, divergence masking, the optimiser step and clamping."""
        clip = self.config.train.clip
        finite = _isfinite(task_loss)
        self.diverged_at.masked_fill_(self.alive & ~finite, step)
        self.alive.logical_and_(finite)
        if clip.mode == "value":
            grads = [g.clamp(-clip.max, clip.max) for g in grads]
        elif clip.mode == "norm":
            # summed parameter by parameter: a reduction of stack(...) over its first
            # dimension adds in another order for one seed than for many
            sq = functools.reduce(torch.add, [g.square().flatten(1).sum(1) for g in grads])
            scale = (clip.max / (sq.sqrt() + 1e-6)).clamp(max=1.0)
            grads = [g * scale.view(-1, *([1] * (g.dim() - 1))) for g in grads]
        grads = [
            torch.where(self.alive.view(-1, *([1] * (g.dim() - 1))) & _isfinite(g), g, 0.0)
            for g in grads
        ]
        self.optimizer.step(grads, self.optimizer.lr_at(step, self.config.train.steps))
        self.model.clamp_()
        if self.config.train.reinit.enabled:
            improved = task_loss < self.best_loss
            self.best_loss.copy_(torch.where(improved, task_loss, self.best_loss))
            self.last_improved.copy_(torch.where(improved, step, self.last_improved))

    def _step_eager(self, step: Tensor) -> None:
        total, task_loss = self._loss_eager(step)
        grads = torch.autograd.grad(total, self.params)
        self._update_eager(step, task_loss, list(grads))

    def train_step(self) -> None:
        self.step_t.fill_(self.step)
        if self.cpu_steps is not None:
            self.cpu_steps.train(self.step, 1)
            self.step += 1
            return
        if self._compile_pending and self.config.compile == "auto":
            try:  # the first call compiles; "auto" falls back to eager if that cannot be done
                self._step(self.step_t)
            except Exception as e:  # no C++ compiler, an unsupported op, ...
                warnings.warn(f"torch.compile failed ({type(e).__name__}: {str(e)[:200]}); "
                              "training eagerly", RuntimeWarning)
                self._step, self.compiled = self._step_eager, False
                self._step(self.step_t)
        else:
            self._step(self.step_t)
        self._compile_pending = False
        self.step += 1

    def train_steps(self, n: int) -> None:
        """``n`` training steps; the same trajectory as ``n`` calls of `train_step`, in
        replays of one captured CUDA graph where `graphed`."""
        if self.engine is not None:
            self.step = self.engine.train(n, self.step)
            return
        end = self.step + n
        if self.cpu_steps is not None and n > 0:  # as n calls of `train_step`, in one native call
            self.cpu_steps.train(self.step, n)
            self.step_t.fill_(end - 1)
            self.step = end
            return
        if self.graphed and n >= GRAPH_STEPS and self._graph is None:
            self._warm_up_and_capture(end)
        if self._graph is not None:
            while end - self.step >= GRAPH_STEPS:
                self.step_t.fill_(self.step)
                self._graph.replay()
                self.step += GRAPH_STEPS
        while self.step < end:
            self.train_step()

    # -- evaluation and re-initialisation ----------------------------------------------------
    def _diverged(self) -> Tensor:
        params_ok = torch.stack([torch.isfinite(p).flatten(1).all(1) for p in self.params]).all(0)
        newly = self.alive & ~params_ok
        self.diverged_at.copy_(torch.where(newly, torch.tensor(self.step, device=self.device), self.diverged_at))
        self.alive.logical_and_(params_ok)
        return ~self.alive

    def maybe_reinitialise(self) -> None:
        r = self.config.train.reinit
        if not r.enabled or self.step == 0 or self.step % r.every:
            return
        stuck = self.alive & (self.step - self.last_improved >= r.patience) & (self.best_loss > r.threshold)
        positions = torch.nonzero(stuck).flatten().tolist()
        if not positions:
            return
        for k in positions:
            self.reinit_counts[k] += 1
        with torch.no_grad():
            self._reset_positions(positions)
            self.model.clamp_()
        self.optimizer.reset_seeds(stuck)
        self.best_loss[stuck] = float("inf")
        self.last_improved[stuck] = self.step

    # -- checkpoints ---------------------------------------------------------------------------
    def checkpoint(self, elapsed_s: float = 0.0) -> TrainerCheckpoint:
        """A frozen copy (on the CPU) of everything the next step depends on
        (`service.training.checkpoint.take_checkpoint`)."""
        if self.engine is not None:
            self.engine.write_back()
        return take_checkpoint(self, elapsed_s)

    def load_checkpoint(self, ckpt: TrainerCheckpoint) -> None:
        """Continue from ``ckpt`` (`service.training.checkpoint.restore_checkpoint`)."""
        restore_checkpoint(self, ckpt)
        if self.engine is not None:
            self.engine.reload()

    # -- the loop ------------------------------------------------------------------------------
    def run(self, on_eval: Callable[[EvalReport], None] | None = None, *,
            resume_from: TrainerCheckpoint | None = None, checkpoint_every: int = 0) -> RunResult:
        """Train to ``train.steps``, calling ``on_eval`` at every evaluation.

        ``resume_from`` continues a checkpointed run; the evaluation at its step is not done
        (nor reported) again. With ``checkpoint_every = k > 0`` every k-th evaluation (by
        step, so a resumed run keeps the same schedule; never the first or the last) hands
        ``on_eval`` a `TrainerCheckpoint` in `EvalReport.checkpoint`.
        """
        t = self.config.train
        if resume_from is not None:
            self.load_checkpoint(resume_from)
        started = time.perf_counter()
        self.model.train()

        def elapsed() -> float:
            return self._elapsed_before + time.perf_counter() - started

        while True:
            due = self.step % t.eval_every == 0 or self.step == t.steps
            if due and not (self._steps and self._steps[-1] == self.step):
                self.evaluate()
                diverged = self._diverged()
                if on_eval is not None:
                    history = self.history()
                    wanted = (checkpoint_every > 0 and 0 < self.step < t.steps and self.step % t.eval_every == 0
                              and (self.step // t.eval_every) % checkpoint_every == 0)
                    on_eval(EvalReport(
                        step=self.step, total_steps=t.steps,
                        interpolation_mse=history.interpolation_mse[-1],
                        extrapolation_mse={n: v[-1] for n, v in history.extrapolation_mse.items()},
                        diverged=diverged.cpu().numpy(), history=history,
                        elapsed_s=elapsed(),
                        checkpoint=self.checkpoint(elapsed()) if wanted else None,
                    ))
            if self.step >= t.steps:
                break
            self.maybe_reinitialise()
            self.train_steps(self._next_stop() - self.step)
        return self.result(elapsed())

    def _next_stop(self) -> int:
        """The next step at which the loop must look: an evaluation, a re-initialisation
        check or the end."""
        t = self.config.train
        every = [t.eval_every] + ([t.reinit.every] if t.reinit.enabled else [])
        return min([t.steps] + [(self.step // k + 1) * k for k in every])

    def result(self, elapsed_s: float, member: int | None = None) -> RunResult:
        """The run's result; with ``member``, that member's alone (its seeds' rows, its
        config): what the member trained on its own returns (`service.training.packing`)."""
        rows = slice(None) if member is None else self.settings.slices[member]
        config = self.config if member is None else self.settings.members[member]
        history = self.history()
        diverged = self._diverged().cpu().numpy()
        diverged_at = [int(v) if v >= 0 else None for v in self.diverged_at.cpu().tolist()]
        final_sparsity = self.model.sparsity_error().detach().cpu().numpy()
        best_sparsity = self.best_sparsity_error.cpu().numpy()
        seeds = []  # each member's seeds against its own thresholds
        for index in range(len(self.settings.members)) if member is None else [member]:
            r = self.settings.slices[index]
            seeds += per_seed_metrics(history.seeds(r), self.member_thresholds[index], best_sparsity[r],
                                      diverged[r], diverged_at[r], self.seed_ids[r],
                                      final_sparsity_error=final_sparsity[r],
                                      prerequisites=self.task.range_prerequisites())
        history = history.seeds(rows)
        weights = {k: w[rows].detach().cpu().numpy() for k, w in self.model.weight_matrices().items()}
        state = {k: v[rows] for k, v in self.model.state_dict().items()}
        return RunResult(
            config=config,
            thresholds=self.thresholds if member is None else self.member_thresholds[member],
            seeds=seeds,
            aggregate=aggregate(seeds),
            history=history,
            weights=weights,
            reinitialisations=list(self.reinit_counts[rows]),
            elapsed_s=elapsed_s,
            device=str(self.device),
            compiled=self.compiled,
            params_sha256=params_sha256(state),
        )


def train(config: RunConfig, on_eval: Callable[[EvalReport], None] | None = None) -> RunResult:
    """Train every seed of ``config``; ``on_eval`` is called at each evaluation step."""
    return Trainer(config).run(on_eval)
