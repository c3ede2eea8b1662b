"""Every unit's name and validated options, importable without torch.

A search space or a run config names a unit and sets its options; checking them must not
load the units' torch code (a sweep's driver validates every trial's run config and never
trains). `service.units.registry` maps the same names to the implementations, and a test
keeps the two in step.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from service.frozen import Frozen

Activation = Literal[
    "relu", "relu6", "sigmoid", "tanh", "leaky_relu", "elu", "selu", "prelu", "silu", "none",
]
LogKind = Literal["eps", "safe", "relu"]


class UnknownUnitError(ValueError):
    """Raised for a unit name that is not registered; the message lists the valid names."""


class UnitOptions(Frozen):
    """Unit-specific options; each unit subclasses this with its own validated fields."""

    PACKABLE: ClassVar[frozenset[str]] = frozenset()
    """Continuous options that may differ per seed (`Unit.set_seed_variants`): read only when
    a seed is initialised, or, in the forward, through per-seed tensors the unit keeps."""


class NACMulOptions(UnitOptions):
    """Options of NAC•."""

    epsilon: float = Field(1e-7, gt=0, description="ε in log(|x| + ε)")


class NALUOptions(UnitOptions):
    """NALU variants (docs/domain/units.md)."""

    PACKABLE: ClassVar[frozenset[str]] = frozenset({
        "tau_start", "tau_end", "tau_t0", "tau_t1", "tau_min", "tau_rate", "gate_bias_init"})

    weights: Literal["shared", "independent"] = Field(
        "shared", description="one W for both paths (the paper's NALU) or one W per path")
    gate: Literal["standard", "bias", "input_independent", "temperature", "gumbel"] = Field(
        "standard", description="σ(Gx), σ(Gx+β), σ(β), σ(τ(t)Gx) or σ(Gx + logistic noise)")
    tau_schedule: Literal["auto", "none", "linear", "exponential"] = Field(
        "auto", description="gate temperature; 'auto': linear for gate='temperature', else none")
    tau_start: float = Field(0.2, gt=0, description="linear schedule: τ at step tau_t0")
    tau_end: float = Field(1.0, gt=0, description="linear schedule: τ from step tau_t1 on")
    tau_t0: int = Field(0, ge=0, description="linear schedule: first step of the ramp")
    tau_t1: int = Field(50_000, ge=1, description="linear schedule: last step of the ramp")
    tau_min: float = Field(0.5, gt=0, description="exponential schedule: lower bound of T")
    tau_rate: float = Field(1e-5, ge=0, description="exponential schedule: T = exp(-rate·step)")
    gate_bias_init: float = Field(0.0, description="initial β of the bias/input_independent gate")
    log: LogKind = Field("eps", description="logarithm of the NAC• path (unused with nmu)")
    mul_unit: Literal["nac_mul", "nmu"] = Field("nac_mul", description="multiplicative path")
    add_unit: Literal["nac_add", "nau"] = Field(
        "nac_add", description="additive path; 'nau' implies weights='independent' "
        "(with mul_unit='nmu': the NAU paper's gated NAU/NMU)")
    sign_correction: bool = Field(
        False, description="iNALU sign recovery on the NAC• path (an NMU keeps signs itself)")
    epsilon: float = Field(1e-7, gt=0, description="ε of the 'eps' logarithm")

    @model_validator(mode="before")
    @classmethod
    def _nau_has_its_own_weights(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("add_unit") == "nau" and "weights" not in data:
            return {**data, "weights": "independent"}
        return data

    @model_validator(mode="after")
    def _check(self) -> "NALUOptions":
        if self.tau_t1 <= self.tau_t0:
            raise ValueError(f"tau_t1 ({self.tau_t1}) must be > tau_t0 ({self.tau_t0})")
        if self.weights == "shared" and self.add_unit == "nau":
            raise ValueError("add_unit='nau' has its own weights: weights='shared' contradicts "
                             "it (leave weights out or set it to 'independent')")
        if self.weights == "shared" and self.mul_unit == "nmu":
            raise ValueError("mul_unit='nmu' needs weights='independent' "
                             "(an NMU's weights live in [0, 1], a NAC's in [-1, 1])")
        return self

    @property
    def temperature(self) -> Literal["none", "linear", "exponential"]:
        """The schedule actually used ('auto' resolved)."""
        if self.tau_schedule == "auto":
            return "linear" if self.gate == "temperature" else "none"
        return self.tau_schedule


class INALUOptions(UnitOptions):
    """Options of the iNALU."""

    PACKABLE: ClassVar[frozenset[str]] = frozenset({"gate_init"})

    epsilon: float = Field(1e-7, gt=0, description="ε in log(max(|x|, ε))")
    omega: float = Field(20.0, gt=0, description="upper clip ω of the log-space product")
    reg_threshold: float = Field(20.0, gt=0, description="t of the saturation regulariser")
    gate_init: float = Field(0.0, description="initial G (g = σ(G); 0 -> an even mix)")


class NPUOptions(UnitOptions):
    """Options of the NPU and RealNPU."""

    epsilon: float = Field(1e-7, gt=0, description="ε in r = ĝ(|x| + ε) + 1 − ĝ")


class MLPOptions(UnitOptions):
    """Options of the MLP."""

    hidden_sizes: tuple[int, ...] = Field((8,), description="width of each hidden layer")
    activation: Activation = Field("relu", description="non-linearity between layers")

    @field_validator("hidden_sizes")
    @classmethod
    def _positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(h < 1 for h in value):
            raise ValueError("every hidden size must be >= 1")
        return value


class LSTMOptions(UnitOptions):
    hidden_size: int = Field(10, ge=1, le=4096, description="LSTM state width")


UNIT_OPTIONS: dict[str, type[UnitOptions]] = {
    "linear": UnitOptions,
    "reg_linear": UnitOptions,
    "nac_add": UnitOptions,
    "nac_mul": NACMulOptions,
    "nalu": NALUOptions,
    "inalu": INALUOptions,
    "nau": UnitOptions,
    "nmu": UnitOptions,
    "npu": NPUOptions,
    "real_npu": NPUOptions,
    "mlp": MLPOptions,
    "lstm": LSTMOptions,
}
"""Each registered unit's name and its ``Options`` class."""


def unit_names() -> list[str]:
    return sorted(UNIT_OPTIONS)


def unit_options(name: str) -> type[UnitOptions]:
    """The options class of the unit ``name``; an unknown name lists the valid ones."""
    try:
        return UNIT_OPTIONS[name]
    except KeyError:
        raise UnknownUnitError(
            f"unknown unit {name!r}; valid units: {', '.join(unit_names())}"
        ) from None
