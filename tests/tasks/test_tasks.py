"""Tasks: shapes, hand-computed targets, fixed evaluation sets, validation messages."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from pydantic import ValidationError

from service.tasks import (
    TASKS,
    ArithmeticTask,
    IdentityTask,
    ManyOperandsTask,
    OperationOnlyTask,
    SingleUnitTask,
    SmallMulTask,
    SubsetOnlyTask,
    Task,
    parse_task,
    task_kinds,
)
from service.tasks.operations import perturb

UNIT_NAMES = {"linear", "mlp", "nac_add", "nac_mul", "nalu", "nau", "nmu", "reg_linear",
              "inalu", "npu", "real_npu"}
SMALL = {"eval_samples": 64, "threshold_samples": 1000}

EXAMPLES: list[Task] = [
    ArithmeticTask(operation=op, **SMALL) for op in ("add", "sub", "mul", "div", "squared", "root")
] + [
    SmallMulTask(**SMALL),
    SingleUnitTask(operation="mul", redundant_inputs=10, **SMALL),
    SingleUnitTask(operation="squared", **SMALL),
    SubsetOnlyTask(**SMALL),
    OperationOnlyTask(operation="div", **SMALL),
    IdentityTask(activation="tanh", **SMALL),
    ManyOperandsTask(operation="product", n_operands=5, **SMALL),
]


def test_registry_lists_every_kind() -> None:
    assert task_kinds() == ["arithmetic", "small_mul", "single_unit", "subset_only",
                            "operation_only", "identity", "many_operands", "sequence_arithmetic",
                            "sequential_digits"]
    for kind, cls in TASKS.items():
        assert cls().kind == kind


@pytest.mark.parametrize("task", EXAMPLES, ids=lambda t: f"{t.kind}-{getattr(t, 'operation', '')}")
def test_task_contract(task: Task) -> None:
    sel = task.selection()
    assert sel.dtype == torch.float64 and sel.shape[1] == task.input_size
    x = task.interpolation.sample((3, 5, task.input_size), torch.Generator().manual_seed(0),
                                  dtype=torch.float64)
    t = task.target(x)
    assert t.shape == (3, 5, task.output_size)
    # the exact selection followed by the operation gives the (fast) target
    torch.testing.assert_close(task.apply_operation(x @ sel.T), t, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(task.target(x.float()), t.float(), rtol=1e-5, atol=1e-5)
    layers = task.default_model()
    assert layers and all(layer["unit"] in UNIT_NAMES for layer in layers)
    assert parse_task(task.model_dump(mode="json")) == task
    assert parse_task(task) is task


def test_arithmetic_subsets_follow_the_spec_geometry() -> None:
    task = ArithmeticTask()
    assert (task.subset_size, task.overlap, task.subsets_span) == (25, 12, 38)
    (a0, a1), (b0, b1) = task.subset_bounds()
    assert a1 - a0 == b1 - b0 == 25
    assert b0 == a1 - 12  # B starts floor(0.5 · 25) positions before A ends
    assert 0 <= a0 and b1 <= 100
    assert task.subset_bounds() == ArithmeticTask().subset_bounds()
    offsets = {ArithmeticTask(dataset_seed=s).subset_bounds()[0][0] for s in range(20)}
    assert len(offsets) > 5  # the offset is random per dataset seed


def test_arithmetic_target_by_hand() -> None:
    task = ArithmeticTask(input_size=8, subset_ratio=0.5, overlap_ratio=0.5, operation="sub")
    (a0, a1), (b0, b1) = task.subset_bounds()
    assert (a1 - a0, b0 - a0) == (4, 2)
    x = torch.arange(1.0, 9.0, dtype=torch.float64)
    a = sum(range(a0 + 1, a1 + 1))
    b = sum(range(b0 + 1, b1 + 1))
    assert task.target(x).item() == a - b
    assert task.model_copy(update={"operation": "mul"}).target(x).item() == a * b
    assert ArithmeticTask(input_size=8, subset_ratio=0.5, operation="root").target(x).item() == math.sqrt(a)


def test_small_tasks_by_hand() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert SmallMulTask().target(x).item() == 10 * 3
    two = torch.tensor([3.0, 4.0], dtype=torch.float64)
    expected = {"add": 7.0, "sub": -1.0, "mul": 12.0, "div": 0.75, "squared": 9.0, "root": math.sqrt(3)}
    for op, value in expected.items():
        assert OperationOnlyTask(operation=op).target(two).item() == pytest.approx(value)
    padded = torch.cat([two, torch.full((10,), 100.0, dtype=torch.float64)])
    assert SingleUnitTask(operation="mul", redundant_inputs=10).target(padded).item() == 12.0
    sub = SubsetOnlyTask(input_size=4, subset_ratio=0.5, overlap_ratio=0.0)
    assert sub.subset_bounds() == ((0, 2), (2, 4))
    assert sub.target(x).tolist() == [3.0, 7.0]
    assert IdentityTask().target(torch.tensor([[-7.5]])).item() == -7.5
    assert ManyOperandsTask(n_operands=4).target(x).item() == 10.0
    assert ManyOperandsTask(operation="product", n_operands=4).target(x).item() == 24.0


def test_default_models_by_operation() -> None:
    assert ArithmeticTask(operation="add").default_model() == [{"unit": "nau"}, {"unit": "nau"}]
    assert ArithmeticTask(operation="mul").default_model() == [{"unit": "nau"}, {"unit": "nmu"}]
    assert ArithmeticTask(operation="div").default_model() == [{"unit": "nac_add"}, {"unit": "nac_mul"}]
    assert SmallMulTask().default_model() == [{"unit": "nau"}, {"unit": "nmu"}]
    assert SingleUnitTask(operation="sub").default_model() == [{"unit": "nau"}]
    identity = IdentityTask(activation="selu").default_model()
    assert identity == [{"unit": "mlp", "options": {"hidden_sizes": [8, 8, 8], "activation": "selu"}}]
    assert IdentityTask().interpolation.intervals == ((-5.0, 5.0),)
    assert IdentityTask().extrapolation["extrapolation"].intervals == ((-20.0, 20.0),)


def test_perturbation_moves_every_weight_to_the_wrong_side() -> None:
    w = torch.tensor([1.0, 0.0, -1.0, 2.0], dtype=torch.float64)
    assert perturb(w, 1e-5).tolist() == [1 - 1e-5, 1e-5, -1 + 1e-5, 2 - 1e-5]
    sel = SmallMulTask().perturbed_selection()
    assert sel[1].tolist() == [1 - 1e-5, 1 - 1e-5, 1e-5, 1e-5]


# -- evaluation sets -------------------------------------------------------------------------------
def test_evaluation_sets_shapes_order_and_targets() -> None:
    task = ArithmeticTask(extrapolation={"wide": "U[2,6]", "neg": "U[-6,-2] ∪ U[2,6]"}, **SMALL)
    sets = task.evaluation_sets()
    assert list(sets) == ["interpolation", "wide", "neg"]
    for name, (x, t) in sets.items():
        assert x.shape == (64, 100) and t.shape == (64, 1)
        assert x.dtype == t.dtype == torch.float32
        rng = task.ranges()[name]
        assert all(any(lo <= v <= hi for lo, hi in rng.intervals) for v in x.flatten().tolist())
        torch.testing.assert_close(t, task.target(x.double()).float())
    assert (sets["neg"][0] < 0).any() and (sets["neg"][0] > 0).any()


def test_evaluation_sets_are_fixed() -> None:
    first = ArithmeticTask(operation="add", **SMALL).evaluation_sets()
    again = ArithmeticTask(operation="add", **SMALL).evaluation_sets()
    other_op = ArithmeticTask(operation="mul", **SMALL).evaluation_sets()
    for name in first:
        assert torch.equal(first[name][0], again[name][0])
        assert torch.equal(first[name][1], again[name][1])
        assert torch.equal(first[name][0], other_op[name][0])  # same inputs for every trial
    twin = ArithmeticTask(extrapolation={"a": "U[1,2]", "b": "U[1,2]"}, **SMALL).evaluation_sets()
    assert not torch.equal(twin["a"][0], twin["b"][0])
    assert not torch.equal(twin["interpolation"][0], twin["a"][0])
    reseeded = ArithmeticTask(operation="add", dataset_seed=1, **SMALL).evaluation_sets()
    assert not torch.equal(first["interpolation"][0], reseeded["interpolation"][0])


def test_evaluation_sets_are_the_same_in_another_process() -> None:
    code = ("from service.tasks import SmallMulTask;"
            "x, t = SmallMulTask(eval_samples=16).evaluation_sets()['extrapolation'];"
            "print(repr(x.double().sum().item()), repr(t.double().sum().item()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    x, t = SmallMulTask(eval_samples=16).evaluation_sets()["extrapolation"]
    assert out.stdout.split() == [repr(x.double().sum().item()), repr(t.double().sum().item())]


# -- validation ---------------------------------------------------------------------------------------
def _error(data: dict) -> str:
    with pytest.raises((ValidationError, ValueError)) as info:
        parse_task(data)
    return str(info.value)


def test_subsets_that_do_not_fit_are_rejected() -> None:
    msg = _error({"kind": "arithmetic", "subset_ratio": 0.6, "overlap_ratio": 0.1})
    assert "subset_ratio" in msg and "input_size" in msg and "do not fit" in msg
    msg = _error({"kind": "subset_only", "input_size": 3, "subset_ratio": 0.1})
    assert "subset_ratio" in msg and "empty" in msg


@pytest.mark.parametrize("data, words", [
    ({"kind": "arithmetic", "operation": "div", "interpolation": "U[-2,2]"}, ["operation", "div", "interpolation"]),
    ({"kind": "single_unit", "operation": "div", "extrapolation": {"far": "U[0,5]"}}, ["div", "far"]),
    ({"kind": "arithmetic", "operation": "div", "interpolation": "U[-2,-1] ∪ U[1,2]"}, ["div", "crosses"]),
    ({"kind": "operation_only", "operation": "root", "interpolation": "U[-2,-1]"}, ["root", "negative"]),
    ({"kind": "arithmetic", "operation": "root", "extrapolation": {"e": "U[-6,-2] ∪ U[2,6]"}}, ["root", "e"]),
])
def test_operations_over_bad_ranges_are_rejected(data: dict, words: list[str]) -> None:
    msg = _error(data)
    assert all(w in msg for w in words), msg


def test_negative_ranges_are_fine_where_they_do_not_matter() -> None:
    ArithmeticTask(operation="div", interpolation="U[-2,-1]", extrapolation={"e": "U[-6,-2]"})
    ArithmeticTask(operation="mul", interpolation="U[-2,2]", extrapolation={"e": "U[-6,-2] ∪ U[2,6]"})
    SingleUnitTask(operation="root", interpolation="U[0,1]", extrapolation={"e": "U[1,5]"})


@pytest.mark.parametrize("data, words", [
    ({"kind": "arithmetic", "interpolation": "U[2,1]"}, ["interpolation", "empty"]),
    ({"kind": "arithmetic", "extrapolation": {"e": "U[1,3] ∪ U[2,4]"}}, ["extrapolation", "overlap"]),
    ({"kind": "arithmetic", "extrapolation": {"interpolation": "U[2,6]"}}, ["extrapolation", "interpolation"]),
    ({"kind": "arithmetic", "extrapolation": {}}, ["extrapolation", "at least one"]),
    ({"kind": "arithmetic", "operation": "pow"}, ["operation", "'add'"]),
    ({"kind": "many_operands", "n_operands": 11}, ["n_operands", "10"]),
    ({"kind": "many_operands", "n_operands": 1}, ["n_operands", "2"]),
    ({"kind": "identity", "activation": "gelu"}, ["activation", "relu"]),
    ({"kind": "small_mul", "operation": "add"}, ["operation", "xtra"]),
])
def test_field_errors_name_the_field(data: dict, words: list[str]) -> None:
    msg = _error(data)
    assert all(w in msg for w in words), msg


def test_unknown_or_missing_kind_lists_the_kinds() -> None:
    for data in ({"kind": "arithmatic"}, {"operation": "add"}):
        with pytest.raises(ValueError) as info:
            parse_task(data)
        assert not isinstance(info.value, ValidationError)
        assert all(kind in str(info.value) for kind in task_kinds())


def test_task_json_round_trip() -> None:
    task = ArithmeticTask(operation="div", interpolation="U[0.1,0.2]",
                          extrapolation={"a": "U[0.2,2]", "b": "U[-6,-2]"}, dataset_seed=7)
    data = json.loads(json.dumps(task.model_dump(mode="json")))
    assert parse_task(data) == task
    assert parse_task(data).subset_bounds() == task.subset_bounds()
