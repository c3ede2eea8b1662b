"""Which NAC• seeds of a `small_mul` (or the `arithmetic` protocol's × row) reproduction
succeed, by the signs of their initial output-layer weights.

    python benchmarks/nac_mul_init_signs.py [reproduce-out/small_mul.json]
    python benchmarks/nac_mul_init_signs.py benchmarks/reproduce_arithmetic.json

The NAC+ → NAC• model on t = (x1+x2+x3+x4)(x1+x2) solves the task only when the NAC• layer's
two weights W = tanh(Ŵ) σ(M̂) end at +1 (the product of the two hidden sums). Its initial
Ŵ is drawn from U[−r, r] with r ≈ 9.47 (the reference init for a 2 → 1 layer), where tanh
is saturated: a weight that starts negative rarely crosses zero. This script rebuilds each
seed's initial weights from the reproduction's own run config (the trainer draws them from
(master seed, seed id) alone, so nothing is trained), counts the positive Ŵ of the NAC•
layer per seed, and prints the success rate in each group beside the overall one — the
explanation of the NAC• row's distance from the published 13% (README, "Reproducing the
papers"). A result records its ``initialisation``: ``philox`` (the current code's streams,
`service.seeding.InitStream`) is rebuilt by the trainer itself; a result without the field
was written before them, with one torch generator per seed (``torch-generators``), and is
rebuilt with that generator through the same units' initialisation code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from service.config import RunConfig  # noqa: E402
from service.seeding import stream_key  # noqa: E402
from service.training import Trainer  # noqa: E402
from service.scoring.metrics import wilson_interval  # noqa: E402

PHILOX, TORCH_GENERATORS = "philox", "torch-generators"
"""A reproduction's ``initialisation``: the current Philox streams, or (no field) the
per-seed torch generators before them."""
_MASK32 = 0xFFFF_FFFF


def _permute32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


class _TorchGeneratorStream:
    """The initialisation before the Philox streams: seed id s's torch generator, seeded
    with ``permute32(s ^ k0) ^ k1`` under the key of ``torch/init``, drawn in unit order."""

    def __init__(self, master_seed: int, seed_id: int) -> None:
        k0, k1 = stream_key(master_seed, "torch/init")
        self.generator = torch.Generator().manual_seed(_permute32(int(seed_id) ^ k0) ^ k1)

    def uniform_(self, w: torch.Tensor, a: float, b: float) -> torch.Tensor:
        return w.uniform_(a, b, generator=self.generator)

    def normal_(self, w: torch.Tensor, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        return w.normal_(mean, std, generator=self.generator)


def initial_positive_counts(config: dict, initialisation: str = PHILOX) -> list[int]:
    """Per seed, how many of the NAC• layer's initial Ŵ are positive (0, 1 or 2)."""
    run = RunConfig.model_validate({**config, "compile": "off", "device": "cpu"})
    trainer = Trainer(run)
    units = trainer.model.units
    if initialisation == TORCH_GENERATORS:
        trainer.model.reset_parameters([_TorchGeneratorStream(run.master_seed, s) for s in trainer.seed_ids])
    elif initialisation != PHILOX:
        raise SystemExit(f"unknown initialisation {initialisation!r}: {PHILOX} or {TORCH_GENERATORS}")
    nac_mul = next(u for u in units if u.name == "nac_mul")
    w_hat = dict(nac_mul.named_parameters())["w_hat"].detach()  # [S, out, in]
    return (w_hat > 0).reshape(w_hat.shape[0], -1).sum(1).tolist()


def split_by_signs(data: dict) -> dict[int, tuple[int, int]]:
    """``{positive initial Ŵ: (seeds, solved)}`` for the NAC• × row of a reproduction."""
    cell = next((c for c in data["cells"]
                 if c["row"]["model"] == "NAC•" and c["row"]["op"] == "×" and c["status"] == "ok"), None)
    if cell is None:
        raise SystemExit("the result has no NAC• × row: run benchmarks/reproduce.py small_mul first")
    success = [s["success"] for s in cell["seeds"]]
    counts = initial_positive_counts(cell["config"], data.get("initialisation", TORCH_GENERATORS))
    if len(counts) != len(success):
        raise SystemExit(f"{len(success)} seed outcomes but the config builds {len(counts)} seeds")
    return split_counts(counts, success)


def split_counts(positive: list[int], success: list[bool]) -> dict[int, tuple[int, int]]:
    """``{k: (seeds with k positive initial Ŵ, of them solved)}`` for k = 0, 1, 2."""
    return {k: (positive.count(k), sum(1 for p, ok in zip(positive, success) if p == k and ok)) for k in (0, 1, 2)}


def main(argv: list[str] | None = None) -> dict[int, tuple[int, int]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", nargs="?", default="benchmarks/reproduce_small_mul.json",
                        help="a small_mul.json or arithmetic.json written by benchmarks/reproduce.py")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.result).read_text())
    split = split_by_signs(data)
    seeds, solved = sum(n for n, _ in split.values()), sum(s for _, s in split.values())
    print(f"NAC• × on {data['protocol']} ({args.result}, {seeds} seeds): success by the number of "
          "positive initial Ŵ in the NAC• layer")
    print(f"{'positive Ŵ':>11}  {'seeds':>5}  {'solved':>6}  rate [95% CI]")
    for k, (n, s) in split.items():
        rate = "—"
        if n:
            low, high = wilson_interval(s, n)
            rate = f"{s / n:.0%} [{low:.0%}, {high:.0%}]"
        print(f"{k:>11}  {n:>5}  {s:>6}  {rate}")
    print(f"{'all':>11}  {seeds:>5}  {solved:>6}  {solved / seeds:.0%}")
    return split


if __name__ == "__main__":
    main()
