"""Handwritten digit images for the sequential digit tasks, never downloaded.

Default: scikit-learn's bundled 8×8 digits (`sklearn.datasets.load_digits`, 1,797 images,
shipped inside the scikit-learn wheel), split once into fixed train / validation / test
images (60/20/20 by a fixed permutation: no image is in two splits). With ``data_dir``:
MNIST from local IDX files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each optionally ``.gz``); the last
sixth of the training file is the validation split, the t10k file the test split.
Pixels are scaled to [0, 1].
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from service.errors import UserError
from service.seeding import generator_for
from service.tasks.base import EVAL_MASTER_SEED

if TYPE_CHECKING:
    from torch import Tensor

SPLIT_FRACTIONS = (0.6, 0.2, 0.2)
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass(frozen=True)
class DigitSplit:
    images: Tensor  # [n, I] float32 in [0, 1]
    labels: Tensor  # [n] int64

    def only(self, digits: tuple[int, ...]) -> "DigitSplit":
        import torch

        keep = torch.isin(self.labels, torch.tensor(digits))
        return DigitSplit(self.images[keep].contiguous(), self.labels[keep].contiguous())


@dataclass(frozen=True)
class DigitSplits:
    train: DigitSplit
    validation: DigitSplit
    test: DigitSplit

    @property
    def width(self) -> int:
        return self.train.images.shape[1]


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (the MNIST file format: magic ``0 0 type ndim``, big-endian sizes)."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise UserError(f"{path}: not an IDX file (bad magic number)")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    count = int(np.prod(dims)) if dims else 0
    offset = 4 + 4 * ndim
    if len(raw) < offset + count * dtype.itemsize:
        raise UserError(f"{path}: truncated IDX file ({len(raw)} bytes for shape {dims})")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(dims)


def _find(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise UserError(f"data_dir {directory}: no {stem}[.gz] (MNIST IDX files are expected there)")


def _split(images: np.ndarray, labels: np.ndarray, scale: float) -> DigitSplit:
    import torch

    x = torch.from_numpy(images.reshape(images.shape[0], -1).astype(np.float32) / scale)
    return DigitSplit(x, torch.from_numpy(labels.astype(np.int64)))


def _mnist(directory: Path) -> DigitSplits:
    train_x = read_idx(_find(directory, "train-images-idx3-ubyte"))
    train_y = read_idx(_find(directory, "train-labels-idx1-ubyte"))
    test_x = read_idx(_find(directory, "t10k-images-idx3-ubyte"))
    test_y = read_idx(_find(directory, "t10k-labels-idx1-ubyte"))
    if train_x.shape[0] != train_y.shape[0] or test_x.shape[0] != test_y.shape[0]:
        raise UserError(f"data_dir {directory}: image and label files differ in length")
    if train_x.shape[0] < 2:
        raise UserError(f"data_dir {directory}: the training file needs at least 2 images")
    n_val = max(1, train_x.shape[0] // 6)
    cut = train_x.shape[0] - n_val
    return DigitSplits(_split(train_x[:cut], train_y[:cut], 255.0),
                       _split(train_x[cut:], train_y[cut:], 255.0),
                       _split(test_x, test_y, 255.0))


def _bundled_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``digits.csv.gz`` (what ``load_digits`` reads): 64 pixels and a label
    per row. Read from the installed package directly (importing scikit-learn takes seconds);
    ``load_digits`` itself when the file is not where it is expected."""
    spec = importlib.util.find_spec("sklearn")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in locations:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            table = np.loadtxt(path, delimiter=",", dtype=np.float64)
            return table[:, :-1], table[:, -1].astype(np.int64)
    if spec is None:
        raise UserError("the bundled digits need scikit-learn (pip install scikit-learn), "
                        "or set data_dir to a folder of MNIST IDX files")
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data, data.target


def _bundled() -> DigitSplits:
    import torch

    images, labels = _bundled_arrays()
    order = torch.randperm(len(labels), generator=generator_for(EVAL_MASTER_SEED, "digits-split")).numpy()
    images, labels = images[order], labels[order]
    a = int(SPLIT_FRACTIONS[0] * len(order))
    b = a + int(SPLIT_FRACTIONS[1] * len(order))
    return DigitSplits(_split(images[:a], labels[:a], 16.0), _split(images[a:b], labels[a:b], 16.0),
                       _split(images[b:], labels[b:], 16.0))


@functools.lru_cache(maxsize=4)
def load_digit_splits(data_dir: str | None = None) -> DigitSplits:
    """The fixed splits: bundled 8×8 digits, or MNIST IDX files from ``data_dir``."""
    if data_dir is None:
        return _bundled()
    directory = Path(data_dir).expanduser()
    if not directory.is_dir():
        raise UserError(f"data_dir {directory} is not a directory")
    return _mnist(directory)
