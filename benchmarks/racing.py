"""Racing against fixed seeds, replayed exactly from a ground truth (issue 44; docs/racing.md).

    python benchmarks/racing.py ground-truth [--out benchmarks/racing_ground_truth.json]
    python benchmarks/racing.py replay [--ground-truth FILE] [--replications 100] [--seed 0]
    python benchmarks/racing.py sweep-check [--ground-truth FILE]   # a real racing sweep against the replay

``ground-truth`` trains the fixed settings of `racing_ground_truth.py` on 256 seeds each
(run it under ``nice``: one thread, about two minutes). ``replay`` needs no training: seed
k's outcome in setting c is a function of (c, k) alone, so every method is replayed on the
same ground truth. Replication r draws a permutation of the 256 seed ids (the j-th seed any
method trains is seed ``perm[j]``) and an arrival order of the settings (as a sampler
would propose them). The methods:

* ``fixed S`` — every setting on S seeds, ranked by the lower end of the 95% Wilson
  interval (then a lower median ``solved_at``, then a lower median error: the sweep's
  objective), the top K = 2 re-trained on 32 fresh seeds, and the pick is the better
  validation interval (the search's rank on a tie), as ``nalu-sweep sweep --validate 2``.
* ``race`` — `service.scoring.race.replay` with a `RaceSpec`; the pick is the last
  incumbent, with no validation (it holds the most evidence already).

Per method: **quality** = how often the pick's true rate (over its 256 seeds) is within
0.05 of the best setting's; **seed·steps** = seeds trained × the 2,000 steps of every run
(nothing here is stopped early by steps: ASHA is left out of both). The replications are
split in halves: a race's parameters are chosen on the first half — the cheapest race at
least as good as fixed-32 there — and reported on the second. False elimination is measured
on two-setting races whose true rates are equal: each setting against its **twin** (its
own outcomes on the seeds shifted by 128, so the same rate on the 256 seeds but other
seeds), and the two settings of the ground truth whose rates are equal.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # racing_ground_truth beside this file

from service.scoring.metrics import wilson_interval  # noqa: E402
from service.scoring.race import Outcome, RaceSpec, replay  # noqa: E402

HERE = Path(__file__).resolve().parent
GROUND_TRUTH = HERE / "racing_ground_truth.json"
NEAR = 0.05  # a pick within this of the best true rate counts as a good pick
TOP_K, VALIDATION_SEEDS = 2, 32
FIXED_SEEDS = (4, 8, 12, 16, 24, 32, 48, 64)

# the per-seed losses a score test can race on (lower is better; NaN is the worst)
LOSSES: dict[str, Callable[[bool, float | None, int | None, int], float]] = {
    # log10 of the error over the success threshold, 0 for every solved seed: among failures,
    # how far from solving
    "error": lambda ok, ratio, solved, steps: math.nan if ratio is None else max(0.0, ratio),
    # the step it was solved at (as a fraction of the run), 2 when never solved
    "solved_at": lambda ok, ratio, solved, steps: 2.0 if solved is None or not ok else solved / steps,
}


@dataclass(frozen=True)
class Truth:
    names: list[str]
    success: np.ndarray  # [settings, seeds] bool
    ratio: list[list[float | None]]
    solved_at: list[list[int | None]]
    steps: int

    @property
    def rates(self) -> np.ndarray:
        return self.success.mean(axis=1)

    def outcomes(self, loss: str) -> dict[str, list[Outcome]]:
        f = LOSSES[loss]
        return {name: [Outcome(bool(ok), f(bool(ok), r, s, self.steps)) for ok, r, s in
                       zip(self.success[i], self.ratio[i], self.solved_at[i])]
                for i, name in enumerate(self.names)}


def load_truth(path: Path) -> Truth:
    data = json.loads(path.read_text())
    rows = data["settings"]
    if not rows:
        raise SystemExit(f"error: {path} has no settings")
    return Truth(names=[r["name"] for r in rows],
                 success=np.array([[c == "1" for c in r["success"]] for r in rows], dtype=bool),
                 ratio=[r["log10_error_ratio"] for r in rows], solved_at=[r["solved_at"] for r in rows],
                 steps=int(data["steps"]))


# -- fixed S, then validation --------------------------------------------------------------------
def _search_rank_key(truth: Truth, i: int, seeds: Sequence[int]) -> tuple[float, float, float]:
    ok = truth.success[i, seeds]
    low = wilson_interval(int(ok.sum()), len(seeds))[0]
    solved = [truth.solved_at[i][k] for k in seeds if truth.success[i, k]]
    ratios = [truth.ratio[i][k] for k in seeds]
    error = math.inf if any(r is None for r in ratios) else float(np.median(ratios))
    return low, -(float(np.median(solved)) if solved else math.inf), -error


def fixed_pick(truth: Truth, seeds: int, perm: np.ndarray) -> tuple[int, int]:
    """(pick, seeds trained) of fixed-S search + top-K validation on the next 32 seeds."""
    search, fresh = list(perm[:seeds]), list(perm[seeds:seeds + VALIDATION_SEEDS])
    ranked = sorted(range(len(truth.names)), key=lambda i: _search_rank_key(truth, i, search), reverse=True)
    top = ranked[:TOP_K]
    pick = max(top, key=lambda i: (wilson_interval(int(truth.success[i, fresh].sum()), len(fresh))[0], -top.index(i)))
    return pick, seeds * len(truth.names) + VALIDATION_SEEDS * len(top)


# -- the replications ----------------------------------------------------------------------------
@dataclass
class Row:
    method: str
    good: list[bool]
    seeds: list[int]
    regret: list[float]  # the best true rate minus the pick's

    def half(self, part: slice) -> tuple[float, float]:
        return float(np.mean(self.good[part])), float(np.mean(self.seeds[part]))


def replications(truth: Truth, count: int, seed: int) -> list[tuple[np.ndarray, list[str]]]:
    rng = np.random.default_rng(seed)
    n = truth.success.shape[1]
    return [(rng.permutation(n), [truth.names[i] for i in rng.permutation(len(truth.names))]) for _ in range(count)]


def race_specs() -> list[tuple[str, RaceSpec]]:
    """The races compared: the sign test, and the score test on each per-seed loss."""
    out = []
    for kind in ("sign", "score:error", "score:solved_at"):
        for first in (4, 8):
            for top in (16, 32, 64, 128):
                if top >= first:
                    out.append((kind, RaceSpec(first_block=first, max_seeds=top, test=kind.split(":")[0])))
    return out


def run_all(truth: Truth, reps: list[tuple[np.ndarray, list[str]]]) -> list[Row]:
    rates = truth.rates
    good_enough = rates >= rates.max() - NEAR - 1e-12
    index = {name: i for i, name in enumerate(truth.names)}
    rows = []
    for s in FIXED_SEEDS:
        picks = [fixed_pick(truth, s, perm) for perm, _ in reps]
        rows.append(Row(f"fixed {s} + validate {TOP_K}×{VALIDATION_SEEDS}", [bool(good_enough[p]) for p, _ in picks],
                        [n for _, n in picks], [float(rates.max() - rates[p]) for p, _ in picks]))
    played = {loss: truth.outcomes(loss) for loss in LOSSES}
    for kind, spec in race_specs():
        outcomes = played[kind.split(":")[1]] if ":" in kind else played["error"]
        results = [replay(outcomes, order, list(perm), spec) for perm, order in reps]
        rows.append(Row(f"race {kind} B={spec.first_block} max={spec.max_seeds}",
                        [bool(good_enough[index[r.pick]]) for r in results], [r.total_seeds for r in results],
                        [float(rates.max() - rates[index[r.pick]]) for r in results]))
    return rows


def false_eliminations(truth: Truth, spec: RaceSpec, loss: str,
                       reps: list[tuple[np.ndarray, list[str]]]) -> tuple[float, int, float, int]:
    """Twins: (rate, races) of two-setting races of equal true rates that ended with a test
    eliminating one; then the same for the ground truth's equal-rate pairs."""
    outcomes = truth.outcomes(loss)
    n = truth.success.shape[1]
    rates = truth.rates
    hits = races = 0
    for i, name in enumerate(truth.names):
        if 0 < rates[i] < 1:
            twin = [outcomes[name][(k + n // 2) % n] for k in range(n)]
            for perm, _ in reps:
                r = replay({"a": outcomes[name], "b": twin}, ["a", "b"], list(perm), spec)
                hits += any(e.reason in ("eliminated", "replaced") for e in r.exits.values())
                races += 1
    pairs = [(a, b) for a in range(len(rates)) for b in range(a + 1, len(rates))
             if rates[a] == rates[b] and 0 < rates[a] < 1]
    pair_hits = pair_races = 0
    for a, b in pairs:
        for perm, _ in reps:
            r = replay({"a": outcomes[truth.names[a]], "b": outcomes[truth.names[b]]}, ["a", "b"], list(perm), spec)
            pair_hits += any(e.reason in ("eliminated", "replaced") for e in r.exits.values())
            pair_races += 1
    return hits / max(1, races), races, pair_hits / max(1, pair_races), pair_races


def spend(truth: Truth, spec: RaceSpec, loss: str, reps: list[tuple[np.ndarray, list[str]]]) -> dict[str, float]:
    """Mean seeds per race spent on the settings that left for each reason."""
    outcomes = truth.outcomes(loss)
    total: dict[str, float] = {}
    for perm, order in reps:
        r = replay(outcomes, order, list(perm), spec)
        for name, exit_ in r.exits.items():
            total[exit_.reason] = total.get(exit_.reason, 0.0) + r.seeds[name] / len(reps)
    return total


def report(truth: Truth, rows: list[Row], count: int, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Print the table (both halves) and the verdict; return the chosen race and figures."""
    a, b = slice(0, count // 2), slice(count // 2, count)
    steps = truth.steps
    reference = next(r for r in rows if r.method.startswith("fixed 32 "))
    ref_a, ref_b = reference.half(a), reference.half(b)
    out(f"{len(truth.names)} settings, best true rate {truth.rates.max():.3f}, "
        f"{int((truth.rates >= truth.rates.max() - NEAR - 1e-12).sum())} within {NEAR}; "
        f"{count} replications, half A = choose, half B = report\n")
    out("| method | quality A | seed·steps A | quality B | seed·steps B | cost B / fixed-32's | mean regret B |")
    out("|---|---|---|---|---|---|---|")
    for r in rows:
        (qa, sa), (qb, sb) = r.half(a), r.half(b)
        out(f"| {r.method} | {qa:.2f} | {sa * steps:,.0f} | {qb:.2f} | {sb * steps:,.0f} | {sb / ref_b[1]:.2f} "
            f"| {np.mean(r.regret[b]):.3f} |")
    races = [r for r in rows if r.method.startswith("race ")]
    chosen = min((r for r in races if r.half(a)[0] >= ref_a[0]), key=lambda r: r.half(a)[1], default=None)
    cheapest_fixed = min((r for r in rows if r.method.startswith("fixed ") and r.half(b)[0] >= ref_b[0]),
                         key=lambda r: r.half(b)[1])
    out(f"\nfixed-32's quality: {ref_a[0]:.2f} (A), {ref_b[0]:.2f} (B) at {ref_b[1] * steps:,.0f} seed·steps (B)")
    out(f"cheapest fixed S reaching it on B: {cheapest_fixed.method}, {cheapest_fixed.half(b)[1] * steps:,.0f} seed·steps")
    result: dict[str, Any] = {"fixed32": {"quality_b": ref_b[0], "seeds_b": ref_b[1]}}
    if chosen is None:
        out("no race reached fixed-32's quality on half A")
        return result
    qb, sb = chosen.half(b)
    met = qb >= ref_b[0] and sb <= ref_b[1] / 3
    out(f"race chosen on A: {chosen.method}; on B: quality {qb:.2f}, {sb * steps:,.0f} seed·steps "
        f"= {sb / ref_b[1]:.2f} of fixed-32's -> target (quality ≥ fixed-32's at ≤ 1/3 of its cost) "
        f"{'MET' if met else 'NOT met'}")
    result.update(chosen=chosen.method, quality_b=qb, seeds_b=sb, met=met)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("ground-truth", help="train the settings on 256 seeds each and write the JSON")
    g.add_argument("--out", type=Path, default=GROUND_TRUTH)
    g.add_argument("--seeds", type=int, default=256)
    r = sub.add_parser("replay", help="replay fixed-S and races on the ground truth; print the table")
    r.add_argument("--ground-truth", type=Path, default=GROUND_TRUTH)
    r.add_argument("--replications", type=int, default=100)
    r.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("sweep-check", help="run a real racing sweep on the ground truth's lr grid and check it "
                                           "against the replay (racing_sweep_check.py)")
    c.add_argument("--ground-truth", type=Path, default=GROUND_TRUTH)
    c.add_argument("--out", type=Path, default=HERE / "results" / "racing_sweep_check.json")
    args = p.parse_args(argv)
    if args.command == "ground-truth":
        from racing_ground_truth import build

        build(args.out, seeds=args.seeds)
        return 0
    if args.command == "sweep-check":
        from racing_sweep_check import main as sweep_check

        return sweep_check(args.ground_truth, args.out)
    if args.replications < 2:
        p.error("--replications must be at least 2 (one half chooses, the other reports)")
    truth = load_truth(args.ground_truth)
    reps = replications(truth, args.replications, args.seed)
    rows = run_all(truth, reps)
    result = report(truth, rows, args.replications)
    if "chosen" in result:
        kind, rest = result["chosen"].removeprefix("race ").split(" ", 1)
        first, top = (int(x.split("=")[1]) for x in rest.split())
        spec = RaceSpec(first_block=first, max_seeds=top, test=kind.split(":")[0])
        loss = kind.split(":")[1] if ":" in kind else "error"
        twin, races, pair, pair_races = false_eliminations(truth, spec, loss, reps[args.replications // 2:])
        print(f"false elimination (a test ended a race of two equal true rates; each direction ≤ "
              f"{spec.alpha}): twins {twin:.3f} over {races} races, the ground truth's equal pairs "
              f"{pair:.3f} over {pair_races} races")
        by_reason = spend(truth, spec, loss, reps[args.replications // 2:])
        print("seeds per race (B) by how the settings left: "
              + ", ".join(f"{k} {v:.0f}" for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
