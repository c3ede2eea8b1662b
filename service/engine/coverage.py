"""Which runs the device engine trains: a pure check of the run configuration (no torch, no
Triton), so a sweep can decide before it builds anything.

Covered: the static tasks ``arithmetic`` (every operation, and packs mixing them) and
``small_mul`` on one interpolation interval; the papers' two-layer model ``I → 2 → 1`` with a first layer
``linear``, ``reg_linear``, ``nau`` or ``nac_add`` and a second of those or ``nmu`` or
``nac_mul``; Adam at a constant learning rate, the MSE loss, no clipping, no
re-initialisation, per-seed batches, float32, a linear or constant λ(t) with no
out-of-bounds penalty. Anything else trains on the torch path (`engine_gap` says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.config import RunConfig

from service.training.protocol import protocol_gap

OPERATION_CODES = {"add": 0, "sub": 1, "mul": 2, "div": 3, "squared": 4, "root": 5}
"""The engine's code of each arithmetic operation; `PER_SEED_OP` when a pack mixes them."""
PER_SEED_OP = 6


def operation_code(task) -> int:
    """The engine's code of ``task``'s operation (``small_mul``, which has none: mul)."""
    return OPERATION_CODES[getattr(task, "operation", "mul")]

UNIT_CODES = {"linear": 0, "nau": 1, "nac_add": 2, "reg_linear": 3, "nmu": 4, "nac_mul": 5}
"""The engine's code of each unit it covers (`service.engine.kernels`)."""
FIRST_LAYER = ("linear", "reg_linear", "nau", "nac_add")
SECOND_LAYER = ("linear", "reg_linear", "nau", "nac_add", "nmu", "nac_mul")
TASKS = ("arithmetic", "small_mul")


def engine_gap(config: RunConfig) -> str | None:
    """None when the engine covers ``config``; otherwise the first reason it does not, as a
    short phrase ("the unit nalu", "clip mode norm")."""
    task = config.task
    if task.kind not in TASKS:
        return f"the task {task.kind}"
    if len(task.interpolation.intervals) != 1:
        return "an interpolation range of several intervals"
    layers = config.layers()
    if len(layers) != 2 or config.model.hidden_size != 2 or task.output_size != 1:
        return "a model other than two layers I -> 2 -> 1"
    if layers[0].unit not in FIRST_LAYER:
        return f"the unit {layers[0].unit} as first layer"
    if layers[1].unit not in SECOND_LAYER:
        return f"the unit {layers[1].unit} as second layer"
    return protocol_gap(config)


def pack_gap(members: "tuple[RunConfig, ...] | list[RunConfig]") -> str | None:
    """`engine_gap` over the members of a pack (each must be covered)."""
    for m in members:
        gap = engine_gap(m)
        if gap is not None:
            return gap
    return None
