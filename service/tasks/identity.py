"""Identity extrapolation (Trask et al. 2018, Fig. 1): why ordinary networks fail."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from service import limits
from service.tasks.base import Task
from service.tasks.ranges import Range

if TYPE_CHECKING:
    import torch

Activation = Literal[
    "relu", "relu6", "sigmoid", "tanh", "leaky_relu", "elu", "selu", "prelu", "silu", "none"
]


class IdentityTask(Task):
    """An MLP learns ``y = x`` on U[−5, 5] and is tested on U[−20, 20], once per activation.

    The NALU paper's autoencoder has 3 hidden layers of 8 units (``hidden_sizes``).
    """

    kind: Literal["identity"] = "identity"
    interpolation: Range = Field(default_factory=lambda: Range.model_validate("U[-5,5]"))
    extrapolation: dict[str, Range] = Field(
        default_factory=lambda: {"extrapolation": Range.model_validate("U[-20,20]")}
    )
    activation: Activation = Field("relu", description="the MLP's activation")
    hidden_sizes: tuple[Annotated[int, Field(ge=1, le=limits.MAX_WIDTH)], ...] = Field(
        (8, 8, 8), min_length=1, max_length=100, description="MLP hidden widths")

    @property
    def input_size(self) -> int:
        return 1

    @property
    def output_size(self) -> int:
        return 1

    def selection(self) -> torch.Tensor:
        import torch

        return torch.ones(1, 1, dtype=torch.float64)

    def apply_operation(self, operands: torch.Tensor) -> torch.Tensor:
        return operands

    def target(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def default_model(self) -> list[dict[str, Any]]:
        return [{"unit": "mlp", "options": {"hidden_sizes": list(self.hidden_sizes),
                                             "activation": self.activation}}]
