"""Sequences of handwritten digit images (NAU paper §4.2, "sequential MNIST"): each step
shows one image, a small per-seed read-out network maps it to a number, and the recurrent
cell accumulates the running sum (digits 0–9; train length 10, test 1–1000) or product
(digits 1–9; train length 2, test 1–20) of the digits shown.

Images: `service.tasks.digit_images` (bundled 8×8 digits, or MNIST IDX files from
``data_dir``). Training sequences draw from the train split, the validation set
("interpolation", training length) from the validation split, the test lengths from the
test split.

Solved reference read-out: the same read-out network (``mlp``, one hidden layer of
``readout_hidden`` ReLU units, one output) fitted to the digit labels of the train split
(MSE, Adam, fixed seed); its per-step error is the read-out's threshold, and its values
feed the nearly solved cell of the length thresholds (`service.tasks.sequence`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from service.errors import UserError
from service.seeding import generator_for
from service.tasks.base import EVAL_MASTER_SEED
from service.tasks.digit_images import DigitSplit, load_digit_splits
from service.tasks.sequence import SequenceSet, SequenceTask, length_name

if TYPE_CHECKING:
    from torch import Tensor


LENGTHS = {
    "sum": (10, (1, 10, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000)),
    "prod": (2, tuple(range(1, 21))),
}
_REFERENCE_BATCH = 512


class SequentialDigitsTask(SequenceTask):
    """``kind: sequential_digits``: running sum/product of the digits in a sequence of images."""

    kind: Literal["sequential_digits"] = "sequential_digits"
    default_lengths: ClassVar[dict[str, tuple[int, tuple[int, ...]]]] = LENGTHS
    data_dir: str | None = Field(None, description="folder with MNIST IDX files; none: scikit-learn's bundled 8×8 digits")
    readout_hidden: int = Field(32, ge=1, le=4096, description="hidden width of the default read-out MLP")
    reference_steps: int = Field(1000, ge=1, le=100_000, description="training steps of the reference read-out")

    @model_validator(mode="after")
    def _data_readable(self) -> "SequentialDigitsTask":
        try:
            splits = [self.split(name) for name in ("train", "validation", "test")]
        except UserError as e:
            raise ValueError(str(e)) from None
        if any(s.labels.numel() == 0 for s in splits):
            raise ValueError("a split has no images of the digits this operation uses")
        return self

    @property
    def digits(self) -> tuple[int, ...]:
        return tuple(range(10)) if self.operation == "sum" else tuple(range(1, 10))

    def split(self, name: str) -> DigitSplit:
        return getattr(load_digit_splits(self.data_dir), name).only(self.digits)

    @property
    def input_size(self) -> int:
        return load_digit_splits(self.data_dir).width

    def largest_operand(self) -> float:
        return 9.0

    def default_model(self) -> list[dict[str, Any]]:
        readout = {"unit": "mlp", "options": {"hidden_sizes": [self.readout_hidden], "activation": "relu"}}
        return [readout, {"unit": "nau" if self.operation == "sum" else "nmu"}]

    def train_data(self, device: Any = None) -> tuple["Tensor", "Tensor"]:
        """The train split's images ``[N, I]`` and labels ``[N]`` (float32) on ``device``."""
        import torch

        train = self.split("train")
        return train.images.to(device), train.labels.to(device, torch.float32)

    def train_batch(self, keys: Tensor, step: Tensor, batch_size: int, data: Any = None) -> tuple[Tensor, Tensor]:
        from service.seeding import generator as rng

        images, labels = data if data is not None else self.train_data(keys.device)
        n = labels.numel()
        u = rng.uniform(keys, step, (batch_size, self.train_length))
        idx = (u * n).long().clamp_(max=n - 1)
        return images[idx], self.accumulate(labels[idx], 2).unsqueeze(-1)

    def _draw(self, name: str, split: DigitSplit, length: int, lengths: dict[str, int]) -> SequenceSet:
        import torch

        gen = generator_for(EVAL_MASTER_SEED, "evaluation", name, self.dataset_seed)
        idx = torch.randint(split.labels.numel(), (self.eval_samples, length), generator=gen)
        operands = split.labels[idx].double()
        return SequenceSet(idx, operands, self.accumulate(operands, 1), lengths, table=split.images)

    def draw_sets(self) -> dict[str, SequenceSet]:
        return {
            "interpolation": self._draw("interpolation", self.split("validation"), self.train_length,
                                        {"interpolation": self.train_length}),
            "test": self._draw("test", self.split("test"), max(self.test_lengths),
                               {length_name(n): n for n in self.test_lengths}),
        }

    def reference_readout(self, images: Tensor) -> Tensor:
        """The solved reference's read-out of ``images [n, I]`` → ``[n]`` (float64)."""
        import torch

        w1, b1, w2, b2 = _fit_reference(self)
        with torch.no_grad():
            return (torch.relu(images @ w1.T + b1) @ w2.T + b2).squeeze(-1).double()

    def reference_values(self, data: SequenceSet) -> Tensor:
        return self.reference_readout(data.table)[data.inputs]


def _fit_reference(task: SequentialDigitsTask) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The reference read-out: an MLP ``I → readout_hidden → 1`` fitted to the train
    split's labels (Adam 1e-2, minibatches of 512, fixed seed); the same for every trial."""
    import torch

    train = task.split("train")
    gen = generator_for(EVAL_MASTER_SEED, "reference-readout", task.dataset_seed)
    width, hidden = train.images.shape[1], task.readout_hidden
    w1 = (torch.rand(hidden, width, generator=gen) * 2 - 1) / width ** 0.5
    b1 = (torch.rand(hidden, generator=gen) * 2 - 1) / width ** 0.5
    w2 = (torch.rand(1, hidden, generator=gen) * 2 - 1) / hidden ** 0.5
    b2 = torch.zeros(1)
    params = [p.requires_grad_() for p in (w1, b1, w2, b2)]
    opt = torch.optim.Adam(params, lr=1e-2)
    target = train.labels.float()
    n = target.numel()
    with torch.enable_grad():
        for _ in range(task.reference_steps):
            idx = torch.randint(n, (min(n, _REFERENCE_BATCH),), generator=gen)
            y = (torch.relu(train.images[idx] @ w1.T + b1) @ w2.T + b2).squeeze(-1)
            loss = (y - target[idx]).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return tuple(p.detach() for p in params)  # type: ignore[return-value]
