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
papers"). The initial weights are the current code's: read a result written by the same
commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.config import RunConfig  # noqa: E402
from service.training import Trainer  # noqa: E402
from service.scoring.metrics import wilson_interval  # noqa: E402


def initial_positive_counts(config: dict) -> list[int]:
    """Per seed, how many of the NAC• layer's initial Ŵ are positive (0, 1 or 2)."""
    run = RunConfig.model_validate({**config, "compile": "off", "device": "cpu"})
    units = Trainer(run).model.units
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
    counts = initial_positive_counts(cell["config"])
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
