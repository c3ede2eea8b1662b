"""`benchmarks/seeds_per_reference.py`'s harness: a clear error without the reference
checkout, and, with a stand-in for the reference's script (the real one needs its own
environment with TensorFlow: the script's docstring says how to make it), one pair run
as whole processes, our command training for real, the ratio computed from the times."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("seeds_per_reference", ROOT / "benchmarks" / "seeds_per_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_the_reference_it_says_where_to_get_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _module().main(["--reference", str(tmp_path / "nowhere")])
    assert e.value.code == 2
    assert "clone AndreasMadsen/stable-nalu there" in capsys.readouterr().err


def test_one_pair_of_whole_processes(tmp_path):
    stand_in = tmp_path / "ref" / "experiments" / "simple_function_static.py"
    stand_in.parent.mkdir(parents=True)
    # the reference's flags as the benchmark passes them; writes where its env says
    stand_in.write_text(
        "import os, sys, time\n"
        "args = sys.argv[1:]\n"
        "assert args[args.index('--max-iterations') + 1] == '50' and '--no-cuda' in args, args\n"
        "assert os.environ['LSB_DJOB_NUMPROC'] == '1' and os.environ['OMP_NUM_THREADS'] == '1'\n"
        "os.makedirs(os.environ['SAVE_DIR'], exist_ok=True)\n"
        "time.sleep(0.5)\n")
    out = tmp_path / "figures.json"
    figures = _module().main(["--reference", str(tmp_path / "ref"), "--reference-python", sys.executable,
                              "--pairs", "1", "--cpu", "-1", "--seeds", "2", "--steps", "50", "--json", str(out)])
    assert json.loads(out.read_text()) == figures
    ours, theirs = figures["ours_s"]["median"], figures["reference_s"]["median"]
    assert ours > 0 and theirs >= 0.5
    assert figures["seeds_per_reference_seed"] == pytest.approx(2 * theirs / ours, abs=0.1)  # of the rounded times
    assert figures["pair_ratios"] == [figures["seeds_per_reference_seed"]]  # one pair: its ratio is the median's
