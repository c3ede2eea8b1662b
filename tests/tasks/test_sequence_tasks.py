"""Recurrent task data: running targets, per-seed streams, fixed digit splits (bundled or
local MNIST IDX files), thresholds per length, and clear configuration errors."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from service.config import RunConfig
from service.seeding import stream_keys
from service.tasks import SequenceArithmeticTask, SequentialDigitsTask, parse_task
from service.tasks.digit_images import load_digit_splits, read_idx
from service.training import Trainer


def test_sequence_arithmetic_targets_are_running_sums_of_the_subset():
    task = parse_task({"kind": "sequence_arithmetic", "input_size": 5, "subset_start": 1, "subset_size": 3})
    keys = stream_keys(0, "data", [0, 1, 2])
    x, t = task.train_batch(keys, torch.tensor(4), 6)
    assert x.shape == (3, 6, 10, 5) and t.shape == (3, 6, 10, 1)
    torch.testing.assert_close(t[..., 0], x[..., 1:4].sum(-1).cumsum(-1), rtol=1e-5, atol=1e-5)
    # each seed's batch comes from its own stream: the same alone as among others
    x1, t1 = task.train_batch(keys[1:2], torch.tensor(4), 6)
    assert torch.equal(x1[0], x[1]) and torch.equal(t1[0], t[1])


def test_products_accumulate_from_one_and_defaults_follow_the_operation():
    task = parse_task({"kind": "sequence_arithmetic", "operation": "prod"})
    assert (task.train_length, task.test_lengths, task.start_state) == (2, (1, 2, 5, 10, 20), 1.0)
    data = task.sequence_sets()["test"]
    operands = data.inputs[..., 0].double() + data.inputs[..., 1].double()
    torch.testing.assert_close(data.targets[:, 4], operands[:, :5].prod(-1))


def test_thresholds_grow_with_length_and_every_length_has_one():
    task = parse_task({"kind": "sequence_arithmetic", "eval_samples": 100})
    thr = task.success_thresholds()
    assert list(thr) == ["length_1", "length_10", "length_100", "length_1000", "readout"]
    values = [thr[f"length_{n}"] for n in task.test_lengths]
    assert all(0 < a < b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("data, words", [
    ({"kind": "sequence_arithmetic", "operation": "prod", "test_lengths": [1000]}, "1e30"),
    ({"kind": "sequence_arithmetic", "extrapolation": {"x": "U[2,6]"}}, "test_lengths"),
    ({"kind": "sequence_arithmetic", "test_lengths": []}, "at least one"),
    ({"kind": "sequence_arithmetic", "subset_start": 3}, "does not fit"),
    ({"kind": "sequential_digits", "data_dir": "/nonexistent/mnist"}, "not a directory"),
])
def test_bad_configurations_name_the_problem(data, words):
    with pytest.raises(ValidationError) as info:
        parse_task(data)
    assert words in str(info.value)


def _bundled_csv() -> np.ndarray:
    """scikit-learn's shipped digits table, read directly (importing scikit-learn is slow)."""
    import importlib.util

    root = Path(importlib.util.find_spec("sklearn").submodule_search_locations[0])
    return np.loadtxt(root / "datasets" / "data" / "digits.csv.gz", delimiter=",")


def test_bundled_digits_split_into_three_disjoint_fixed_parts():
    splits = load_digit_splits()
    parts = [splits.train, splits.validation, splits.test]
    assert [p.labels.numel() for p in parts] == [1078, 359, 360]
    # together they are exactly the 1,797 bundled images, each once
    mine = np.concatenate([p.images.numpy() * 16 for p in parts])
    rows = {tuple(r) for r in mine.round().astype(int)}
    reference = _bundled_csv()[:, :-1]
    assert sorted(map(tuple, mine.round().astype(int))) == sorted(map(tuple, reference.astype(int)))
    assert len(rows) == len({tuple(r) for r in reference.astype(int)})
    assert load_digit_splits() is splits  # fixed: loaded once, the same every time


def test_digit_product_uses_digits_one_to_nine_and_sum_all_ten():
    prod = parse_task({"kind": "sequential_digits", "operation": "prod"})
    total = parse_task({"kind": "sequential_digits"})
    assert set(prod.split("train").labels.tolist()) == set(range(1, 10))
    assert set(total.split("test").labels.tolist()) == set(range(10))
    assert (total.train_length, max(total.test_lengths)) == (10, 1000)
    assert (prod.train_length, max(prod.test_lengths)) == (2, 20)


def _write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def _tiny_mnist(directory: Path) -> None:
    rng = np.random.default_rng(0)
    labels = np.arange(36) % 10
    images = np.zeros((36, 5, 5))
    images[np.arange(36), labels // 5, labels % 5] = 255  # digit d lights pixel d
    images += rng.integers(0, 20, images.shape)
    images = images.clip(0, 255)
    _write_idx(directory / "train-images-idx3-ubyte", images[:24])
    _write_idx(directory / "train-labels-idx1-ubyte.gz", labels[:24], compress=True)
    _write_idx(directory / "t10k-images-idx3-ubyte.gz", images[24:], compress=True)
    _write_idx(directory / "t10k-labels-idx1-ubyte", labels[24:])


def test_mnist_idx_files_from_data_dir_train_end_to_end(tmp_path):
    _tiny_mnist(tmp_path)
    assert read_idx(tmp_path / "t10k-images-idx3-ubyte.gz").shape == (12, 5, 5)
    task = parse_task({"kind": "sequential_digits", "data_dir": str(tmp_path), "eval_samples": 20,
                       "test_lengths": [1, 5], "reference_steps": 50})
    assert isinstance(task, SequentialDigitsTask) and task.input_size == 25
    splits = load_digit_splits(str(tmp_path))
    assert [s.labels.numel() for s in (splits.train, splits.validation, splits.test)] == [20, 4, 12]
    assert float(splits.train.images.max()) == 1.0
    config = RunConfig.model_validate({"task": task, "seeds": 2, "device": "cpu",
                                       "train": {"steps": 4, "eval_every": 2, "batch_size": 4}})
    result = Trainer(config).run()
    assert list(result.thresholds) == ["length_1", "length_5", "readout"]
    assert result.history.interpolation_mse.shape == (3, 2)


def test_a_broken_idx_file_is_a_clear_error(tmp_path):
    _tiny_mnist(tmp_path)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(ValidationError) as info:
        parse_task({"kind": "sequential_digits", "data_dir": str(tmp_path)})
    assert "train-images-idx3-ubyte" in str(info.value)


def test_sequence_tasks_are_registered_kinds():
    assert isinstance(parse_task({"kind": "sequence_arithmetic"}), SequenceArithmeticTask)
    assert parse_task({"kind": "sequence_arithmetic"}).extrapolation_names()[-2:] == ["length_1000", "readout"]
