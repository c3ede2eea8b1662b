"""The native CPU step: the papers' NAU → NMU model trained seed by seed in C between two
evaluations, with the eager torch step's bits.

On a CPU the torch step of a small model is mostly dispatch: each of its ~60 operations
costs microseconds of set-up whatever the seed count, and compiling it away costs seconds
of torch's compiler at start-up. For the model most runs train (`covers`: an NAU of
``I → 2``, an NMU of ``2 → 1``, Adam, the MSE, the static arithmetic task) one native call
(``nalu_cpu_train`` in ``service/native/cpu_step.c``) runs every step up to the next
evaluation, one seed after another, its batch, weights and optimiser state in cache: the
batch drawn by the generator's own routine, the first layer and its weight gradient by the
units' own kernels, and the NMU, the loss, the regulariser and Adam as the same rounded
float operations, in the same order, as the eager step (`Trainer._step_eager`).

So a seed's numbers are the same with the native step or without it (no C compiler,
``NALU_SWEEP_NATIVE=0``): both train the eager step's bits, and `compile: auto` never
compiles a covered run (`service.training.device.compile_mode`), wherever it trains. The
trainer keeps everything else: initialisation, evaluations, divergence, history,
checkpoints (the step works in place on the trainer's own tensors).
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from service import native
from service.seeding import generator as rng
from service.training.protocol import protocol_gap
from service.units import kernels, sampled_linear

if TYPE_CHECKING:
    from service.config import RunConfig

OPERATION_CODES = {"add": 0, "sub": 1, "mul": 2, "div": 3, "squared": 4, "root": 5}
"""The C step's code of each arithmetic operation (``cpu_step.c``)."""
SEED_STEPS_PER_CALL = 1 << 18
"""Most seed·steps one native call trains (≈ 2 s on one core; per thread): a longer stretch
is trained in several calls (the same bits), so Ctrl-C and a sweep's stop are not held up."""


def gap(config: "RunConfig") -> str | None:
    """None when the native step trains ``config``'s runs (from the configuration alone:
    never from the seeds or the pack); otherwise the first reason it does not."""
    task, layers = config.task, config.layers()
    checks = [
        (config.compile == "on", "compile: on"),
        (task.kind != "arithmetic", f"the task {task.kind}"),
        (not task.operand_runs() or len(task.operand_runs()) > 2, "targets other than two runs' sums"),
        ([u.unit for u in layers] != ["nau", "nmu"], "a model other than nau -> nmu"),
        (config.model.hidden_size != 2 or task.output_size != 1, "a model other than I -> 2 -> 1"),
        (any(u.options for u in layers), "unit options"),
        (getattr(task, "operation", None) not in OPERATION_CODES, f"the operation {getattr(task, 'operation', None)}"),
    ]
    return next((reason for failing, reason in checks if failing), None) or protocol_gap(config)


def covers(config: "RunConfig", device: torch.device) -> bool:
    """Whether runs of ``config`` on ``device`` train the native step's bits: on a CPU where
    `gap` is None (whether or not the native step can run here)."""
    return device.type == "cpu" and gap(config) is None


def _setup(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    fs, ints = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int64)
    lib.nalu_cpu_train.restype = ctypes.c_int
    lib.nalu_cpu_train.argtypes = (
        [p, p, p, p, i, i, i, i, i, i, i, fs, fs, f, i, ints, ints, p]  # functions, keys, sizes, draw plan, ops
        + [p] * 6  # w1, m1, v1, w2, m2, v2
        + [p] * 7 + [i] + [p] * 6  # alive ... table, L, group ... eps
        + [i] + [p] * 4)  # reg_shape, lam_max, t_start, span, scratch
    return lib


def _lib() -> ctypes.CDLL | None:
    return native.load("cpu_step", _setup)


def available() -> bool:
    """Whether the native step can run here: its library and the generator's and units'
    kernels it calls (AVX2 and FMA, a C compiler, ``NALU_SWEEP_NATIVE`` not "0")."""
    return sampled_linear.available() and _lib() is not None


class CpuSteps:
    """Trains a `Trainer`'s steps with ``nalu_cpu_train``, in place on its tensors; on
    ``torch.get_num_threads()`` threads, each a contiguous range of the seeds (a seed's
    numbers are its own: the same bits on any number of threads)."""

    def __init__(self, trainer: "Trainer") -> None:
        self.trainer = trainer
        task, t = trainer.task, trainer.config.train
        self.rows, self.cols = t.batch_size, task.input_size
        self.intervals = task.interpolation.intervals
        self.runs = task.operand_runs()
        self.ops = torch.tensor(trainer.settings.per_seed(lambda m: OPERATION_CODES[m.task.operation]),
                                dtype=torch.int64)  # each seed its member's operation
        self.keys = trainer.data_keys.to(torch.int64).contiguous()
        units = kernels.native_library()
        self.fwd = ctypes.cast(units.nalu_linear_fwd, ctypes.c_void_p).value
        self.dw = ctypes.cast(units.nalu_linear_dw, ctypes.c_void_p).value
        self.scratch_floats = self.rows * (self.cols + len(self.runs) + 4) + 2 * self.cols
        self._scratch: list[torch.Tensor] = []
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    @classmethod
    def attach(cls, trainer: "Trainer") -> "CpuSteps | None":
        """The native step of ``trainer``'s run where it covers it and can run here."""
        if not all(covers(m, trainer.device) for m in trainer.settings.members):
            return None
        if trainer.dtype != torch.float32 or not trainer.fuses_first_layer:
            return None
        return cls(trainer) if available() else None

    def _ranges(self) -> list[tuple[int, int]]:
        S = self.trainer.num_seeds
        n = max(1, min(torch.get_num_threads(), S))
        return [(S * i // n, S * (i + 1) // n) for i in range(n)]

    def train(self, step0: int, n: int) -> None:
        """Steps ``step0 … step0 + n − 1`` of every seed."""
        if n <= 0:
            return
        tr = self.trainer
        opt, sch = tr.optimizer, tr.schedule
        w1, w2 = (u.weight for u in tr.model.units)
        (m1, v1), (m2, v2) = opt.state
        per_seed = [self.keys, self.ops, w1, m1, v1, w2, m2, v2, tr.alive, tr.diverged_at, opt.steps, opt.powers,
                    opt._betas, opt.lr64, opt._group, opt._last, opt._one_minus_b1, opt._b2, opt._one_minus_b2,
                    opt._eps, sch.lambda_max, sch.t_start, sch.span]
        if not all(x.is_contiguous() for x in (*per_seed, opt._bias_table)):
            raise RuntimeError("the native CPU step needs contiguous trainer state")
        ranges = self._ranges()
        while len(self._scratch) < len(ranges):
            self._scratch.append(torch.empty(self.scratch_floats, dtype=torch.float32))
        draw, plan = rng.native_draw(self.intervals, self.runs)
        S, table = tr.num_seeds, opt._bias_table
        # a seed range's pointers: each tensor's address of its first seed (seeds are the
        # leading dimension; Adam's powers and betas are [2, S], their rows S apart)
        columns = (opt.powers, opt._betas)
        per_row = [x.element_size() * (1 if any(x is c for c in columns) else x[0].numel()) for x in per_seed]

        def call(s0: int, s1: int, scratch: torch.Tensor, first: int, count: int) -> int:
            (keys, ops, p1, pm1, pv1, p2, pm2, pv2, alive, div, steps, powers, betas, lr, group, last, omb1, b2,
             omb2, eps, lam, t_start, span) = [x.data_ptr() + s0 * r for x, r in zip(per_seed, per_row)]
            return _lib().nalu_cpu_train(
                draw, self.fwd, self.dw, keys, s1 - s0, S, first, count, self.rows, self.cols, *plan, ops,
                p1, pm1, pv1, p2, pm2, pv2, alive, div, steps, powers, betas, lr, table.data_ptr(), table.shape[2],
                group, last, omb1, b2, omb2, eps, 1 if sch.shape == "constant" else 0, lam, t_start, span,
                scratch.data_ptr())

        chunk = max(1, SEED_STEPS_PER_CALL * len(ranges) // S)
        for first in range(step0, step0 + n, chunk):
            count = min(chunk, step0 + n - first)
            if len(ranges) == 1:
                statuses = [call(0, S, self._scratch[0], first, count)]
            else:  # ctypes lets go of the GIL for the call: the ranges train side by side
                if self._pool_size < len(ranges):
                    self._pool = ThreadPoolExecutor(len(ranges), thread_name_prefix="nalu-cpu-step")
                    self._pool_size = len(ranges)
                futures = [self._pool.submit(call, a, b, scratch, first, count)
                           for (a, b), scratch in zip(ranges, self._scratch)]
                statuses = [f.result() for f in futures]
            if any(statuses):
                raise RuntimeError(f"nalu_cpu_train failed ({statuses})")
