"""Native kernels and their torch fallbacks give the same bits (issue 12 item 7): the
layers of `service.units.kernels` on many shapes, and a whole training run with every
native kernel on against all of them off (``NALU_SWEEP_NATIVE=0``, as on a node without a C
compiler): the same final-parameter digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from service.units import kernels

ROOT = Path(__file__).resolve().parents[1]


def _native_or_skip():
    if not kernels.native_available():
        pytest.skip("no native kernel here")


def _both(monkeypatch, f, *args):
    """``f(*args)`` with the kernels, then with the torch fallback."""
    with_kernels = f(*args)
    monkeypatch.setattr(kernels, "native_available", lambda: False)
    try:
        fallback = f(*args)
    finally:
        monkeypatch.undo()
    return with_kernels, fallback


def _grads(f, x, w, g):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    z = f(x, w)
    return (z.detach(), *torch.autograd.grad(z, (x, w), g))


@pytest.mark.parametrize("S, B, I, O", [(3, 130, 100, 2), (7, 13, 37, 3), (5, 9, 2, 1), (2, 5, 1, 1),
                                        (4, 4, 17, 4), (3, 6, 9, 1), (2, 128, 100, 1), (1, 3, 8, 2)])
def test_linear_native_and_fallback_are_bit_identical(monkeypatch, S, B, I, O):
    _native_or_skip()
    g = torch.Generator().manual_seed(S * 1000 + B * 10 + I)
    x = torch.randn(S, B, I, generator=g) * 3
    w = torch.randn(S, O, I, generator=g)
    up = torch.randn(S, B, O, generator=g)
    native, fallback = _both(monkeypatch, _grads, kernels.linear, x, w, up)
    for a, b in zip(native, fallback):
        assert torch.equal(a, b)
    shared = torch.randn(B, I, generator=g).expand(S, B, I)  # an evaluation set (stride 0)
    strided = torch.randn(S, B, 2 * I, generator=g)[..., ::2]
    for xs in (shared, strided):
        assert torch.equal(*_both(monkeypatch, kernels.linear, xs, w))
    torch.testing.assert_close(native[0], torch.matmul(w, x.transpose(1, 2)).transpose(1, 2), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("S, B, I, O", [(3, 130, 100, 2), (2, 9, 16, 1), (2, 5, 17, 3), (1, 4, 1, 4),
                                        (2, 33, 191, 2), (2, 7, 192, 1), (2, 6, 193, 2), (1, 3, 400, 3)])
def test_the_weight_gradient_is_the_same_on_every_instruction_set(S, B, I, O):
    """AVX2 and AVX-512 (where the CPU has it) give the same weight gradient: the same
    sequential sum per element, over contiguous, strided and shared (stride-0) batches and
    over column counts on either side of the AVX-512 kernel's 192-column blocks."""
    _native_or_skip()
    lib = kernels.native_library()
    if int(lib.nalu_units_isa()) < 2:
        pytest.skip("this CPU has no AVX-512: one instruction set only")
    g = torch.Generator().manual_seed(S * 1000 + B * 10 + I + O)
    up = torch.randn(S, B, O, generator=g)
    w = torch.randn(S, O, I, generator=g)
    batches = [torch.randn(S, B, I, generator=g) * 3, torch.randn(B, I, generator=g).expand(S, B, I),
               torch.randn(S, B, 2 * I, generator=g)[..., ::2]]

    def weight_gradient(x):
        wg = w.clone().requires_grad_(True)
        return torch.autograd.grad(kernels.linear(x, wg), wg, up)[0]

    best = [weight_gradient(x) for x in batches]
    torch.testing.assert_close(best[0], torch.einsum("sbo,sbi->soi", up, batches[0]), rtol=1e-4, atol=1e-3)
    lib.nalu_units_force_isa(1)
    try:
        for x, want in zip(batches, best):
            assert torch.equal(weight_gradient(x), want)
    finally:
        lib.nalu_units_force_isa(2)
    assert int(lib.nalu_units_isa()) == 2


@pytest.mark.parametrize("S, B, O", [(3, 5, 1), (4, 7, 3), (2, 128, 1), (3, 17, 2)])
def test_two_input_nmu_native_and_fallback_are_bit_identical(monkeypatch, S, B, O):
    _native_or_skip()
    g = torch.Generator().manual_seed(S + 10 * B + 100 * O)
    x = torch.rand(S, B, 2, generator=g) * 6 - 3
    w = torch.rand(S, O, 2, generator=g)
    up = torch.randn(S, B, O, generator=g)
    native, fallback = _both(monkeypatch, _grads, kernels.nmu2, x, w, up)
    for a, b in zip(native, fallback):
        assert torch.equal(a, b)


_RUN = """
import json, sys, torch
from service.config import RunConfig
from service.seeding import generator
from service.training import train
from service.units import kernels
cfg = RunConfig.model_validate(json.loads(sys.argv[1]))
result = train(cfg)
print(json.dumps({"digest": result.params_sha256, "rng": generator.native_available(),
                  "units": kernels.native_available()}))
"""


def _digest(config: dict, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(config)], cwd=ROOT, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("layers", [["nau", "nmu"], ["nalu", "nalu"]])
def test_training_digest_is_the_same_with_and_without_native_kernels(layers):
    _native_or_skip()
    config = {"task": {"kind": "arithmetic", "operation": "mul", "eval_samples": 200, "threshold_samples": 20_000},
              "model": {"layers": [{"unit": u} for u in layers]},
              "train": {"steps": 60, "batch_size": 64, "eval_every": 30},
              "seeds": 4, "device": "cpu", "compile": "off"}
    on = _digest(config, {"NALU_SWEEP_NATIVE": "1"})
    off = _digest(config, {"NALU_SWEEP_NATIVE": "0"})
    assert on["rng"] and on["units"] and not off["rng"] and not off["units"]
    assert on["digest"] == off["digest"]
