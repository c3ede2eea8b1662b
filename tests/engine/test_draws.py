"""The engine draws the trainer's data: the Philox streams of `service.seeding`, bit for bit."""

import pytest
import torch

pytest.importorskip("triton", reason="the engine needs Triton (pip install 'nalu-sweep[engine]')")

from service.engine.layout import padded_width  # noqa: E402
from service.seeding import generator as rng, stream_keys  # noqa: E402


@pytest.mark.parametrize("inputs", [100, 7])  # one Philox call per 4 columns; per element
def test_draws_are_the_trainer_streams_bit_for_bit(inputs: int, device: str) -> None:
    from service.engine import philox

    keys = torch.cat([stream_keys(3, "data", [0, 5]), stream_keys(-7, "data", [2**32 - 1])]).to(device)
    rows, width = 8, padded_width(inputs)
    out = torch.empty(3, rows, inputs, device=device)
    for step in (0, 3, 2**32 + 1):  # the call counter's high word too
        philox.draw_kernel[(3,)](out, keys, step, rows, inputs, width, inputs % 4 == 0 and width >= 16,
                                 -1.5, 4.0, enable_fp_fusion=False)
        expected, _ = rng.sample(keys, step, (rows, inputs), ((-1.5, 2.5),))
        assert torch.equal(out, expected), f"step {step}: the draws differ"
