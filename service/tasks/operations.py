"""The binary operations of the arithmetic tasks and the ranges each one can be used on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from service.tasks.ranges import Range

if TYPE_CHECKING:
    import torch

Operation = Literal["add", "sub", "mul", "div", "squared", "root"]
OPERATIONS: tuple[str, ...] = ("add", "sub", "mul", "div", "squared", "root")


def apply_binary(operation: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a ∘ b`` elementwise; ``squared`` is ``a·a`` and ``root`` is ``√a`` (b unused).
    Called every training step: tensor methods only, no import."""
    if operation == "add":
        return a + b
    if operation == "sub":
        return a - b
    if operation == "mul":
        return a * b
    if operation == "div":
        return a / b
    if operation == "squared":
        return a * a
    if operation == "root":  # the correctly rounded root (a CPU's float32 sqrt is MKL's, not always)
        return a.double().sqrt().to(a.dtype)
    raise ValueError(f"unknown operation {operation!r}; valid operations: {', '.join(OPERATIONS)}")


def check_operation_ranges(operation: str, ranges: dict[str, Range], field: str = "operation") -> None:
    """Reject ranges on which the operation is undefined for some inputs.

    ``div``: the divisor must stay away from zero, so a range that contains 0 (an endpoint
    included) or takes both signs is refused (a sum of inputs from it can reach 0).
    ``root``: the operand must be non-negative, so a range with negative values is refused.
    """
    for name, rng in ranges.items():
        if operation == "div" and (rng.contains_zero() or (rng.low < 0.0 < rng.high)):
            raise ValueError(
                f"{field}='div' needs a divisor that stays away from zero, but the {name} "
                f"range {rng} contains or crosses 0; use a range that is entirely positive "
                "or entirely negative"
            )
        if operation == "root" and rng.has_negative():
            raise ValueError(
                f"{field}='root' needs non-negative operands, but the {name} range {rng} "
                "has negative values"
            )


def single_unit_weights(operation: str, input_size: int) -> torch.Tensor:
    """The exact weights ``[I]`` (float64) of one unit computing ``x1 ∘ x2`` directly:
    coefficients for add/sub (``z = w·x``), exponents for the multiplicative operations
    (``z = ±Π |x_i|^{w_i}``: mul [1, 1], div [1, −1], squared [2, 0], root [½, 0])."""
    import torch

    first, second = {
        "add": (1.0, 1.0), "sub": (1.0, -1.0), "mul": (1.0, 1.0), "div": (1.0, -1.0),
        "squared": (2.0, 0.0), "root": (0.5, 0.0),
    }[operation]
    w = torch.zeros(input_size, dtype=torch.float64)
    w[0], w[1] = first, second
    return w


def perturb(w: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``w → w − ε·sign(w)`` for ``w ≠ 0`` (every magnitude shrinks), ``0 → ε``."""
    import torch

    return torch.where(w == 0, torch.full_like(w, epsilon), w - epsilon * torch.sign(w))


def single_unit_error(x: torch.Tensor, weights: torch.Tensor, additive: bool,
                      target: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Nearly perfect single unit minus the exact one, ``[N, I] → [N, 1]``.

    The unit's exact weights are moved ε towards the wrong side (`perturb`). Additive:
    ``δ = x·Δw``. Multiplicative: the sign is kept and ``δ = t·(Π|x_i|^{Δw_i} − 1)``,
    computed as ``t·expm1(Δw·log|x|)`` for precision.
    """
    import torch

    dw = (perturb(weights, epsilon) - weights).to(dtype=x.dtype, device=x.device)
    if additive:
        return (x @ dw).unsqueeze(-1)
    log_abs = torch.log(x.abs().clamp_min(1e-300))
    return target * torch.expm1(log_abs @ dw).unsqueeze(-1)


def unit_for_operation(operation: str) -> str:
    """The reference unit that can represent ``operation`` on already-selected operands.

    add/sub: NAU; mul: NMU; div and root need exponents −1 and ½, which an NMU cannot
    express, so NAC• (``exp(W log|x|)``); squared of one operand needs exponent 2, beyond
    NAC•'s W ∈ [−1, 1], so a RealNPU (unbounded exponents).
    """
    return {
        "add": "nau", "sub": "nau", "mul": "nmu", "div": "nac_mul",
        "squared": "real_npu", "root": "nac_mul",
    }[operation]
