"""`Engine`: a `Trainer`'s training steps and evaluations run as Triton kernels on its device.

The trainer stays the orchestrator (initialisation, evaluation schedule, history, metrics,
checkpoints); the engine takes its state once (`service.engine.layout.from_trainer`), then
trains many steps per launch and evaluates without the host, handing back only per-seed
MSEs, and writes its state back when the trainer needs it (an evaluation's sparsity and
divergence, a checkpoint, the result).

On a CPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set here before
the kernels are first imported for a CPU run): slow, for the contract tests only.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from service.engine.coverage import PER_SEED_OP, engine_gap, operation_code, pack_gap
from service.engine.layout import EngineState, from_trainer, padded_width, unit_codes, write_back

if TYPE_CHECKING:
    from service.training.trainer import Trainer

ROWS_PER_CHUNK = 32  # batch rows per chunk of a step (registers: RB × IP per program)
EVAL_ROWS = 64  # evaluation rows per chunk
STEPS_PER_LAUNCH = 1000  # at most; a launch runs to the next evaluation


class EngineUnavailable(RuntimeError):
    """The engine cannot train this run here (Triton missing, or the run not covered)."""


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _kernels(device: torch.device):
    """The kernels module; for a CPU run, compiled for Triton's interpreter when they are
    first imported."""
    if device.type == "cpu" and "service.engine.philox" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise EngineUnavailable("the engine runs on a CPU only in Triton's interpreter: set "
                                "TRITON_INTERPRET=1 before service.engine's kernels are imported")
    from service.engine import kernels

    return kernels


def unavailable_reason(trainer: "Trainer") -> str | None:
    """Why ``trainer`` cannot use the engine (None: it can)."""
    if not triton_available():
        return "Triton is not installed (pip install 'nalu-sweep[engine]')"
    gap = pack_gap(trainer.settings.members) if hasattr(trainer, "settings") else engine_gap(trainer.config)
    return None if gap is None else f"the engine does not cover {gap}"


def attach(trainer: "Trainer", notice: Callable[[str], None] = print, **options) -> bool:
    """Let the device engine train and evaluate ``trainer``'s run where it covers it
    (``trainer.engine``); otherwise the run stays on the torch path, and ``notice`` gets one
    line saying why. ``options``: `Engine`'s. Returns whether the engine is used."""
    reason = unavailable_reason(trainer)
    if reason is None:
        try:
            trainer.engine = Engine(trainer, **options)
            return True
        except EngineUnavailable as e:
            reason = str(e)
    notice(f"engine: {reason}; training on the torch path")
    return False


def attach_on_gpu(trainer: "Trainer", notice: Callable[[str], None] = print) -> bool:
    """A sweep's trial or pack: `attach` when the run trains on a GPU, unless the environment
    sets ``NALU_SWEEP_ENGINE=0`` (then, as on a CPU, the torch path, silently)."""
    if trainer.device.type != "cuda" or os.environ.get("NALU_SWEEP_ENGINE", "1") == "0":
        return False
    return attach(trainer, notice)


class Engine:
    """Trains and evaluates ``trainer``'s seeds on the device engine."""

    def __init__(self, trainer: "Trainer", rows_per_chunk: int = ROWS_PER_CHUNK, num_warps: int = 4) -> None:
        reason = unavailable_reason(trainer)
        if reason is not None:
            raise EngineUnavailable(reason)
        self.trainer = trainer
        self.k = _kernels(trainer.device)
        self.state: EngineState = from_trainer(trainer)
        task = trainer.task
        I = task.input_size
        IP = padded_width(I)
        (lo, hi), = task.interpolation.intervals
        u1, u2 = unit_codes(trainer)
        second = trainer.model.units[1]
        self.eps2 = float(getattr(second.options, "epsilon", 1e-7))
        runs = task.operand_runs() or ((0, 0), (0, 0))
        B = trainer.config.train.batch_size
        self.consts = dict(
            B=B, I=I, IP=IP, JOIN=I % 4 == 0 and IP >= 16, RB=min(rows_per_chunk, max(1, 1 << (B - 1).bit_length())),
            TGT=1 if task.kind == "small_mul" else 0,
            OP=PER_SEED_OP if trainer.member_tasks.mixed else operation_code(task),
            A0=runs[0][0], A1=runs[0][1], B0=runs[1][0], B1=runs[1][1], U1=u1, U2=u2,
            REG=1 if trainer.schedule.shape == "constant" else 0,
        )
        self.range = (float(lo), float(hi - lo))  # rounded to float32 by the launch, as torch rounds them
        self.num_warps = num_warps
        self.eval_sets = {name: (x.contiguous(), y.reshape(-1).contiguous())
                          for name, (x, y) in trainer.eval_sets.items()}
        rows = trainer.eval_task_rows  # each seed's row of the targets (mixed operations)
        self.eval_rows = (torch.zeros(trainer.num_seeds, dtype=torch.int64, device=trainer.device)
                          if rows is None else rows.to(torch.int64))

    @property
    def num_seeds(self) -> int:
        return self.trainer.num_seeds

    def train(self, n: int, step0: int) -> int:
        """``n`` training steps from ``step0`` (launches of at most `STEPS_PER_LAUNCH`);
        returns the step reached."""
        st, done = self.state, 0
        while done < n:
            k = min(STEPS_PER_LAUNCH, n - done)
            self.k.train_kernel[(self.num_seeds,)](
                st.keys, st.l1, st.l2, st.flags, st.hyper, st.opt_steps, st.table, st.group,
                st.table.shape[1], step0 + done, k, self.range[0], self.range[1], self.eps2,
                **self.consts, num_warps=self.num_warps, enable_fp_fusion=False)
            done += k
        return step0 + n

    def mse(self, name: str) -> Tensor:
        """Per-seed MSE ``[S]`` (float64) on the evaluation set ``name``."""
        x, y = self.eval_sets[name]
        out = torch.empty(self.num_seeds, dtype=torch.float64, device=x.device)
        c = self.consts
        self.k.eval_kernel[(self.num_seeds,)](
            x, y, self.eval_rows, self.state.l1, self.state.l2, out, x.shape[0], self.eps2, I=c["I"], IP=c["IP"],
            EB=EVAL_ROWS, U1=c["U1"], U2=c["U2"], num_warps=self.num_warps, enable_fp_fusion=False)
        return out

    def write_back(self, optimizer: bool = True) -> None:
        write_back(self.state, self.trainer, optimizer)

    def reload(self) -> None:
        """Take the trainer's state again (after it loaded a checkpoint)."""
        self.state = from_trainer(self.trainer)
