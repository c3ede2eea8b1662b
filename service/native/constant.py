"""Mark a native-availability probe as a compile-time constant without importing dynamo.

``torch.compiler.assume_constant_result`` imports ``torch._dynamo`` (about 1.5 s of CPU)
just to set one attribute on the function. The probes are decorated at import time, and
every process that imports the data generator or the unit kernels (the sweep's driver, an
eager trial, a read of the config) would pay for it without compiling anything. This sets
the same marker; `tests/test_native_constant.py` checks it is exactly what torch sets."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable[..., object])

# the attribute dynamo's `assume_constant_result` sets (torch/_dynamo/decorators.py)
DYNAMO_CONSTANT_MARK = "_dynamo_marked_constant"


def compile_time_constant(fn: F) -> F:
    """``fn`` with dynamo's constant-result mark: ``torch.compile`` calls it once while
    tracing and bakes its result into the graph instead of tracing into it."""
    setattr(fn, DYNAMO_CONSTANT_MARK, True)
    return fn
