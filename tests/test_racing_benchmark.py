"""benchmarks/racing.py replays fixed-S sweeps and races on a (here synthetic) ground truth."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _ground_truth(path: Path, rates: dict[str, float], seeds: int = 128) -> Path:
    rng = np.random.default_rng(7)
    settings = []
    for name, rate in rates.items():
        ok = rng.random(seeds) < rate
        settings.append({"name": name, "params": {}, "success": "".join("1" if s else "0" for s in ok),
                         "log10_error_ratio": [round(float(-1 if s else rng.uniform(0.5, 6)), 2) for s in ok],
                         "solved_at": [1000 if s else None for s in ok]})
    path.write_text(json.dumps({"space": "synthetic", "steps": 2000, "seeds": seeds, "settings": settings}))
    return path


def test_replay_picks_the_one_good_setting_and_a_race_drops_the_hopeless_after_one_block(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))  # a script folder, not a package
    racing = importlib.import_module("racing")
    rates = {"perfect": 1.0, **{f"hopeless {i}": 0.0 for i in range(5)}, "half": 0.5}
    path = _ground_truth(tmp_path / "truth.json", rates)
    assert racing.main(["replay", "--ground-truth", str(path), "--replications", "4"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in out.splitlines() if line.startswith("| ")}
    assert rows["fixed 32 + validate 2×32"][3] == "1.00"  # quality on half B
    race = rows["race sign B=8 max=32"]
    assert race[3] == "1.00"
    # the perfect setting is raced to 32 seeds, every other setting leaves after its first 8
    # (the half setting is shown worse within 16): far below fixed-32's 7·32 + 2·32 seeds
    assert int(race[4].replace(",", "")) <= (32 + 5 * 8 + 16) * 2000
    assert "false elimination" in out


def test_the_sweep_check_compares_a_sweeps_records_with_the_ground_truth_and_the_replay():
    """`racing_sweep_check.compare` (the real sweep itself is the benchmark's): records that
    are the replay's agree; a seed that learned otherwise, or a standing the replay does not
    give, is reported as a mismatch."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    check = importlib.import_module("racing_sweep_check")
    good, bad = "1" * 64, "0" * 64
    settings = [{"params": {"lr": 0.1}, "success": good, "log10_error_ratio": [0.0] * 64},
                {"params": {"lr": 0.01}, "success": bad, "log10_error_ratio": [3.0] * 64}]
    records = [{"lr": 0.1, "number": 0, "standing": "incumbent", "seeds": 64, "success": good},
               {"lr": 0.01, "number": 1, "standing": "eliminated", "seeds": 8, "success": bad[:8]}]
    result = check.compare(settings, records)
    assert result["agree"] and result["pick"] == {"sweep": 0.1, "replay": 0.1}
    assert [r["replay"]["standing"] for r in result["rows"]] == ["incumbent", "eliminated"]
    flipped = [records[0], {**records[1], "success": "1" + bad[:7]}]
    assert not check.compare(settings, flipped)["agree"]
    late = [records[0], {**records[1], "seeds": 16, "success": bad[:16]}]
    assert not check.compare(settings, late)["agree"]
