"""Train the `small_mul` NAC• model from the reference code's initial weights of its seeds.

    python benchmarks/nac_mul_reference_init.py [--seeds 100] [--steps 200000]

The NAU paper's NAC• row (13% of 100 seeds) came from the reference implementation
(``AndreasMadsen/stable-nalu``, ``experiments/simple_function_static.py --layer-type NAC
--nac-mul normal --simple``). Its script seeds torch's global generator with the seed id,
builds the NAC+ → NAC• network (whose constructor draws Ŵ, M̂ of layer 1 then layer 2 from
U[−r, r]) and calls ``reset_parameters`` once more, so the weights it trains are the second
draw. This script redraws those weights for seeds 0..S−1 the same way (torch's CPU
generator of the installed version, which the paper's torch 1.x may not reproduce), copies
them into this project's trainer with `benchmarks/reproduce.py`'s NAC• configuration, trains,
and prints the outcome split by the number of positive initial Ŵ in the NAC• layer — so the
project's trainer and metrics can be compared with the paper on the paper's own starting
points (README, "Reproducing the papers"). About 2 minutes on one CPU core for 100 seeds.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.config import RunConfig  # noqa: E402
from service.training import Trainer  # noqa: E402
from service.units.nac import nac_init_range  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from nac_mul_init_signs import split_counts  # noqa: E402

HIDDEN, INPUTS = 2, 4


def reference_initial_weights(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(Ŵ, M̂) of layer 1, (Ŵ, M̂) of layer 2]`` as the reference script leaves them."""
    torch.manual_seed(seed)
    layers = [((HIDDEN, INPUTS), nac_init_range(INPUTS, HIDDEN)), ((1, HIDDEN), nac_init_range(HIDDEN, 1))]
    drawn: list[tuple[torch.Tensor, torch.Tensor]] = []
    for _ in range(2):  # the network's constructor, then the script's reset_parameters()
        drawn = [(torch.empty(shape).uniform_(-r, r), torch.empty(shape).uniform_(-r, r)) for shape, r in layers]
    return drawn


def nac_mul_config(seeds: int, steps: int | None) -> RunConfig:
    """`benchmarks/reproduce.py`'s small_mul NAC• run, on the CPU."""
    spec = importlib.util.spec_from_file_location("reproduce", ROOT / "benchmarks" / "reproduce.py")
    reproduce = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = reproduce  # its dataclasses look their module up
    spec.loader.exec_module(reproduce)
    protocol = reproduce.PROTOCOLS["small_mul"]
    model = next(m for m in protocol.models if m.name == "NAC•")
    return reproduce.run_config(protocol, "mul", model, seeds, steps or protocol.steps, "cpu")


def main(argv: list[str] | None = None) -> dict[int, tuple[int, int]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=100, help="reference seeds 0..N-1 (the paper: 100)")
    parser.add_argument("--steps", type=int, default=None, help="shorten the 2e5-step protocol (a quick check)")
    args = parser.parse_args(argv)
    initial = [reference_initial_weights(seed) for seed in range(args.seeds)]
    trainer = Trainer(nac_mul_config(args.seeds, args.steps))
    with torch.no_grad():
        for layer, unit in enumerate(trainer.model.units):
            params = dict(unit.named_parameters())
            params["w_hat"].copy_(torch.stack([w[layer][0] for w in initial]))
            params["m_hat"].copy_(torch.stack([w[layer][1] for w in initial]))
    start = time.perf_counter()
    result = trainer.run()
    positive = [int((w[1][0] > 0).sum()) for w in initial]
    solved = [seed.success for seed in result.seeds]
    split = split_counts(positive, solved)
    at = sorted(seed.solved_at for seed in result.seeds if seed.success)
    print(f"NAC• on small_mul from the reference's initial weights of seeds 0-{args.seeds - 1}: "
          f"{sum(solved)}/{args.seeds} solved ({time.perf_counter() - start:.0f} s)")
    for k, (n, s) in split.items():
        print(f"  {k} positive initial Ŵ in the NAC• layer: {s}/{n} solved")
    if at:
        print(f"  solved_at median {at[len(at) // 2]:.3g}")
    return split


if __name__ == "__main__":
    main()
