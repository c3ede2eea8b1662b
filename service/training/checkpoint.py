"""Checkpoints of a seed-batched run: everything needed to continue it bit for bit.

A run's state is small and explicit: the parameters, the per-seed optimiser state, the
step, the per-seed masks and counters (alive, diverged_at, best loss, last improvement,
re-initialisation counts, the best evaluation so far and its sparsity error) and the
evaluation history.
The data and the noise of step t depend only on (per-seed key, t), and a re-initialisation
only on (per-seed key, re-initialisation count), so nothing else is needed to draw the
same numbers again.

Files are written with `torch.save` and read with ``torch.load(weights_only=True)``: a
checkpoint holds tensors, numbers, strings and lists/dicts of them only, so loading one
never unpickles arbitrary objects or runs code.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from service.config import RunConfig
from service.errors import UserError
from service.scoring.metrics import AggregateMetrics, EvalHistory, SeedMetrics
from service.training.result import RunResult


class CheckpointedState(Protocol):
    """What a checkpoint reads from and writes back into a `service.training.trainer.Trainer`
    (a protocol, so this lower module does not import the trainer that uses it)."""

    fingerprint: str
    seed_ids: list[int]
    num_seeds: int
    device: torch.device
    step: int
    step_t: Tensor
    model: torch.nn.Module
    optimizer: Any
    alive: Tensor
    diverged_at: Tensor
    best_loss: Tensor
    last_improved: Tensor
    best_interpolation_mse: Tensor
    best_step: Tensor
    best_sparsity_error: Tensor
    reinit_counts: list[int]
    _steps: list[int]
    _interp: list[Tensor]
    _extrap: dict[str, list[Tensor]]
    _elapsed_before: float

FORMAT = 5
"""Version of the payload layout; a checkpoint of another version is refused. 2: data and
noise from Philox4x32-10 streams (a format-1 checkpoint was trained on another generator;
continuing it would change its trajectory); 3: the per-seed best-evaluation state and the
final sparsity error were added; 4: initialisation and re-initialisation generators seeded
by a bijection of the seed id (a format-3 run draws other weights); 5: initial weights from
Philox streams (`seeding.InitStream`), no generator states kept."""

_IGNORED_FIELDS = ("device", "compile", "cuda_graphs")
"""Run-config fields that do not change the trajectory (a run may move device or compile
mode when it is resumed); every other field must match."""


class CheckpointError(UserError):
    """A checkpoint that cannot continue this run (another configuration, another format)."""


def config_fingerprint(config: RunConfig) -> str:
    """SHA-256 of the run config without `_IGNORED_FIELDS`: a checkpoint continues only
    the configuration that wrote it."""
    data = config.model_dump(mode="json")
    for key in _IGNORED_FIELDS:
        data.pop(key, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def pack_fingerprint(members: "tuple[RunConfig, ...] | list[RunConfig]") -> str:
    """The fingerprint of a run over ``members``: one member's `config_fingerprint`, or
    one over the members' in order (a packed run, `service.training.seed_settings`)."""
    prints = [config_fingerprint(m) for m in members]
    if len(prints) == 1:
        return prints[0]
    return hashlib.sha256(("pack:" + ";".join(prints)).encode()).hexdigest()


def cpu_copy(t: Tensor) -> Tensor:
    """A detached CPU copy, never a view of the live tensor (a checkpoint is frozen)."""
    return t.detach().to("cpu", copy=True)


@dataclass(frozen=True)
class TrainerCheckpoint:
    """The state of a `Trainer` after the evaluation (if any) at ``step``."""

    config_fingerprint: str
    seed_ids: tuple[int, ...]
    step: int  # steps done; the evaluation at ``step`` (if due) is in the history
    elapsed_s: float
    model: dict[str, Tensor]  # the model's state_dict, [S, ...] each
    optimizer_steps: Tensor  # [S] int64
    optimizer_powers: Tensor  # [2, S] float64: Adam's β1^t, β2^t per seed
    optimizer_state: tuple[tuple[Tensor, ...], ...]  # per parameter, the optimiser's buffers
    alive: Tensor  # [S] bool
    diverged_at: Tensor  # [S] int64, −1 = not diverged
    best_loss: Tensor  # [S]
    last_improved: Tensor  # [S] int64
    best_interpolation_mse: Tensor  # [S] float64, the lowest interpolation MSE so far
    best_step: Tensor  # [S] int64, the step of that evaluation
    best_sparsity_error: Tensor  # [S] float64, the sparsity error of that step's weights
    reinit_counts: tuple[int, ...]
    eval_steps: tuple[int, ...]
    interpolation_mse: Tensor  # [E, S] float64
    extrapolation_mse: dict[str, Tensor]  # range -> [E, S] float64

    def to_payload(self) -> dict[str, Any]:
        """Plain tensors, numbers, strings, lists and dicts (what ``weights_only`` loads)."""
        return {
            "format": FORMAT,
            "config_fingerprint": self.config_fingerprint,
            "seed_ids": list(self.seed_ids),
            "step": self.step,
            "elapsed_s": self.elapsed_s,
            "model": dict(self.model),
            "optimizer_steps": self.optimizer_steps,
            "optimizer_powers": self.optimizer_powers,
            "optimizer_state": [list(s) for s in self.optimizer_state],
            "alive": self.alive,
            "diverged_at": self.diverged_at,
            "best_loss": self.best_loss,
            "last_improved": self.last_improved,
            "best_interpolation_mse": self.best_interpolation_mse,
            "best_step": self.best_step,
            "best_sparsity_error": self.best_sparsity_error,
            "reinit_counts": list(self.reinit_counts),
            "eval_steps": list(self.eval_steps),
            "interpolation_mse": self.interpolation_mse,
            "extrapolation_mse": dict(self.extrapolation_mse),
        }

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> "TrainerCheckpoint":
        _check_format(payload, "trainer checkpoint")
        try:
            return cls(
                config_fingerprint=str(payload["config_fingerprint"]),
                seed_ids=tuple(int(s) for s in payload["seed_ids"]),
                step=int(payload["step"]),
                elapsed_s=float(payload["elapsed_s"]),
                model={str(k): _tensor(v) for k, v in payload["model"].items()},
                optimizer_steps=_tensor(payload["optimizer_steps"]),
                optimizer_powers=_tensor(payload["optimizer_powers"]),
                optimizer_state=tuple(tuple(_tensor(t) for t in s) for s in payload["optimizer_state"]),
                alive=_tensor(payload["alive"]),
                diverged_at=_tensor(payload["diverged_at"]),
                best_loss=_tensor(payload["best_loss"]),
                last_improved=_tensor(payload["last_improved"]),
                best_interpolation_mse=_tensor(payload["best_interpolation_mse"]),
                best_step=_tensor(payload["best_step"]),
                best_sparsity_error=_tensor(payload["best_sparsity_error"]),
                reinit_counts=tuple(int(c) for c in payload["reinit_counts"]),
                eval_steps=tuple(int(s) for s in payload["eval_steps"]),
                interpolation_mse=_tensor(payload["interpolation_mse"]),
                extrapolation_mse={str(k): _tensor(v) for k, v in payload["extrapolation_mse"].items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"not a valid trainer checkpoint ({type(e).__name__}: {e})") from None

    def save(self, path: str | Path) -> Path:
        return save_payload(self.to_payload(), path)

    @classmethod
    def load(cls, path: str | Path) -> "TrainerCheckpoint":
        return cls.from_payload(load_payload(path))


def _tensor(value: Any) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"expected a tensor, got {type(value).__name__}")
    return value


def _check_format(payload: Any, what: str) -> None:
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"not a {what} of format {FORMAT} (got {got!r})")


def save_payload(payload: dict[str, Any], path: str | Path) -> Path:
    """`torch.save` to ``path`` through a temporary file, so a crash mid-write never leaves
    a truncated checkpoint under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_payload(path: str | Path) -> dict[str, Any]:
    """``torch.load(weights_only=True)`` onto the CPU: tensors and plain data only."""
    try:
        payload = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except Exception as e:  # noqa: BLE001 - corrupt file, or an object weights_only refuses
        raise CheckpointError(f"{path}: cannot read the checkpoint ({type(e).__name__}: {str(e)[:300]})") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: not a checkpoint (a {type(payload).__name__})")
    return payload


# -- finished results (a trial's completed tasks) -------------------------------------------------------
def result_payload(result: RunResult) -> dict[str, Any]:
    """A `RunResult` as tensors and plain data, exact (NaN and ±inf kept); its config is
    not stored: the caller rebuilds it (`result_from_payload`)."""
    h = result.history
    return {
        "format": FORMAT,
        "config_fingerprint": config_fingerprint(result.config),
        "thresholds": {k: float(v) for k, v in result.thresholds.items()},
        "seeds": [_plain(s.model_dump()) for s in result.seeds],
        "aggregate": _plain(result.aggregate.model_dump()),
        "steps": torch.from_numpy(np.array(h.steps, dtype=np.int64)),
        "interpolation_mse": torch.from_numpy(np.array(h.interpolation_mse, dtype=np.float64)),
        "extrapolation_mse": {n: torch.from_numpy(np.array(v, dtype=np.float64))
                              for n, v in h.extrapolation_mse.items()},
        "weights": {n: torch.from_numpy(np.array(w)) for n, w in result.weights.items()},
        "reinitialisations": [int(r) for r in result.reinitialisations],
        "elapsed_s": float(result.elapsed_s),
        "device": result.device,
        "compiled": bool(result.compiled),
        "params_sha256": result.params_sha256,
    }


def _plain(value: Any) -> Any:
    """Python numbers, strings, None, lists and dicts only (numpy scalars become numbers):
    what ``weights_only`` loading accepts."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if value is None:
        return None
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint")


def result_from_payload(payload: dict[str, Any], config: RunConfig) -> RunResult:
    """The `RunResult` of `result_payload`, with ``config`` (which must be the one it was
    trained with)."""
    _check_format(payload, "stored result")
    if payload.get("config_fingerprint") != config_fingerprint(config):
        raise CheckpointError("a stored result belongs to another run configuration")
    try:
        return RunResult(
            config=config,
            thresholds={str(k): float(v) for k, v in payload["thresholds"].items()},
            seeds=[SeedMetrics.model_validate(s) for s in payload["seeds"]],
            aggregate=AggregateMetrics.model_validate(payload["aggregate"]),
            history=EvalHistory(
                steps=_tensor(payload["steps"]).numpy(),
                interpolation_mse=_tensor(payload["interpolation_mse"]).numpy(),
                extrapolation_mse={str(n): _tensor(v).numpy() for n, v in payload["extrapolation_mse"].items()},
            ),
            weights={str(n): _tensor(w).numpy() for n, w in payload["weights"].items()},
            reinitialisations=[int(r) for r in payload["reinitialisations"]],
            elapsed_s=float(payload["elapsed_s"]),
            device=str(payload["device"]),
            compiled=bool(payload["compiled"]),
            params_sha256=str(payload["params_sha256"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"not a valid stored result ({type(e).__name__}: {e})") from None


def params_sha256(state: dict[str, Tensor]) -> str:
    """SHA-256 of a state dict's names, dtypes, shapes and bytes: equal digests mean
    bit-identical parameters (how a resumed run is checked against an uninterrupted one)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# -- a trainer's state in and out ---------------------------------------------------------
def take_checkpoint(self: CheckpointedState, elapsed_s: float = 0.0) -> TrainerCheckpoint:
    """A frozen copy (on the CPU) of everything the next step depends on; taken after an
    evaluation, a run resumed from it continues with that step's re-initialisation check
    and training step, exactly as the uninterrupted run does."""
    def stacked(rows: list[Tensor]) -> Tensor:  # [E, S] float64
        return cpu_copy(torch.stack(rows)) if rows else torch.zeros(0, self.num_seeds, dtype=torch.float64)

    return TrainerCheckpoint(
        config_fingerprint=self.fingerprint,
        seed_ids=tuple(self.seed_ids),
        step=self.step,
        elapsed_s=float(elapsed_s),
        model={k: cpu_copy(v) for k, v in self.model.state_dict().items()},
        optimizer_steps=cpu_copy(self.optimizer.steps),
        optimizer_powers=cpu_copy(self.optimizer.powers),
        optimizer_state=tuple(tuple(cpu_copy(b) for b in st) for st in self.optimizer.state),
        alive=cpu_copy(self.alive),
        diverged_at=cpu_copy(self.diverged_at),
        best_loss=cpu_copy(self.best_loss),
        last_improved=cpu_copy(self.last_improved),
        best_interpolation_mse=cpu_copy(self.best_interpolation_mse),
        best_step=cpu_copy(self.best_step),
        best_sparsity_error=cpu_copy(self.best_sparsity_error),
        reinit_counts=tuple(self.reinit_counts),
        eval_steps=tuple(self._steps),
        interpolation_mse=stacked(self._interp),
        extrapolation_mse={n: stacked(v) for n, v in self._extrap.items()},
    )

@torch.no_grad()
def restore_checkpoint(self: CheckpointedState, ckpt: TrainerCheckpoint) -> None:
    """Continue from ``ckpt`` (written by this configuration; device and compile mode
    may differ)."""
    if ckpt.config_fingerprint != self.fingerprint:
        raise CheckpointError("the checkpoint was written by another run configuration "
                              "(tasks, model, training settings or seeds differ)")
    if list(ckpt.seed_ids) != self.seed_ids or set(ckpt.extrapolation_mse) != set(self._extrap):
        raise CheckpointError("the checkpoint's seeds or extrapolation ranges differ from the run's")
    dev = self.device
    self.model.load_state_dict({k: v.to(dev) for k, v in ckpt.model.items()})
    self.optimizer.load_state_dict({"steps": ckpt.optimizer_steps.to(dev),
                                    "powers": ckpt.optimizer_powers.to(dev),
                                    "state": [[b.to(dev) for b in st] for st in ckpt.optimizer_state]})
    for live, saved in ((self.alive, ckpt.alive), (self.diverged_at, ckpt.diverged_at),
                        (self.best_loss, ckpt.best_loss), (self.last_improved, ckpt.last_improved),
                        (self.best_interpolation_mse, ckpt.best_interpolation_mse),
                        (self.best_step, ckpt.best_step), (self.best_sparsity_error, ckpt.best_sparsity_error)):
        live.copy_(saved.to(dev))
    self.reinit_counts = list(ckpt.reinit_counts)
    self._steps = list(ckpt.eval_steps)
    self._interp = list(ckpt.interpolation_mse.to(dev).unbind(0))
    self._extrap = {n: list(ckpt.extrapolation_mse[n].to(dev).unbind(0)) for n in self._extrap}
    self.step = ckpt.step
    self.step_t.fill_(max(ckpt.step - 1, 0))  # what the last step left (evaluations read it)
    self._elapsed_before = ckpt.elapsed_s
