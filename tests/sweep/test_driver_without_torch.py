"""A sweep's driver never loads torch: it checks every trial's run config, groups packs and
follows the trials, but only the workers train. Importing torch costs about 1.3 s of a
sweep's fixed cost on a 2-core machine (docs/performance.md). Nor do its trial workers
load Optuna, which only the driver's searcher uses (0.2 s of every worker's start), and
with the embedded store no process but the driver loads MLflow (`driver_tracking`). The
workers' plots are drawn by their plotting processes (`plot_server`). With no Ray running,
the sweep starts its own and says so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]

# Every process started with this directory on PYTHONPATH (the driver, Ray's processes and
# its workers) records its pid when it first imports torch, optuna, mlflow, matplotlib or
# IPython (asked for, installed or not).
WATCH = '''
import os, sys
from pathlib import Path

class _TorchWatch:
    def find_spec(self, name, path=None, target=None):
        if name in ("torch", "optuna", "mlflow", "matplotlib", "IPython"):
            Path(os.environ["TORCH_WATCH_DIR"], f"{name}-{os.getpid()}").touch()
        return None

sys.meta_path.insert(0, _TorchWatch())
'''


def _env(hook: Path) -> dict[str, str]:
    return {**os.environ, "TORCH_WATCH_DIR": str(hook),
            "PYTHONPATH": os.pathsep.join([str(hook), str(REPO), os.environ.get("PYTHONPATH", "")])}


def _hook(tmp_path: Path) -> Path:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(WATCH)
    return hook


def test_checking_every_search_space_loads_no_torch(tmp_path: Path) -> None:
    """The shipped search spaces load, and every trial config of their searched values
    builds, with its regulariser and pack structure, in a process that has no torch. The
    exception: a ``sequential_digits`` task checks its digit images when it is validated,
    and reads them as torch tensors."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import service.cli.sweep, service.sweep.driver, service.sweep.trainable
        from service.pack_structure import structure_key
        from service.search.assign import run_configs
        from service.search.loading import load_space
        from service.search.targets import searched_values
        from service.sweep.logged_params import regularizer_params, task_params
        checked = 0
        for path in sorted(Path({str(REPO / 'search_spaces')!r}).glob("*.yaml")):
            if "sequential_digits" in path.read_text():
                continue
            space = load_space(path)
            checked += 1
            configs = run_configs(space, searched_values(space))
            task_params(space), regularizer_params(configs)
            for config in configs.values():
                structure_key(config)
        print(checked, "torch" in sys.modules)
    """)
    hook = _hook(tmp_path)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(hook),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    checked, loaded = proc.stdout.split()
    assert int(checked) >= 5 and loaded == "False", proc.stdout
    assert not list(hook.glob("torch-*"))


def test_a_sweep_trains_in_its_workers_and_its_driver_loads_no_torch(tmp_path: Path) -> None:
    space = {
        "name": "notorch", "task": {"kind": "arithmetic", "operation": "add"},
        "fixed": {"model": {"layers": [{"unit": "nau"}, {"unit": "nmu"}]}, "device": "cpu",
                  "compile": "off"},
        "params": {"lr": {"type": "categorical", "choices": [0.01, 0.02], "target": "train.optimizer.lr"}},
        "seeds": 2, "steps": 20, "eval_every": 10, "trials": 2, "concurrency": 1,
        "scheduler": {"type": "none"}, "sampler": {"type": "grid"}, "resources": {"cpus": 1, "gpus": 0},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    hook = _hook(tmp_path)
    driver = subprocess.Popen([sys.executable, "-m", "service", "sweep", "space.yaml"], cwd=tmp_path,
                              env=_env(hook), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = driver.communicate(timeout=300)
    assert driver.returncode == 0, out
    assert "2 completed" in out, out
    assert "started a local Ray for this sweep" in out, out  # none was running (tests/conftest.py)
    loaded = {int(p.name.split("-")[1]) for p in hook.glob("torch-*")}
    assert loaded, "no worker recorded importing torch: the watch did not run"
    assert driver.pid not in loaded, out
    # both trials ran in one worker: Tune reuses the trial actor (``reuse_actors``)
    assert len(loaded) == 1, loaded
    with_optuna = {int(p.name.split("-")[1]) for p in hook.glob("optuna-*")}
    assert driver.pid in with_optuna, "the driver's searcher is Optuna's: the watch did not see it"
    assert not loaded & with_optuna, "a trial worker imported Optuna"
    # the embedded SQLite store: the driver answers its workers' tracking calls, so only it
    # imports MLflow (no helper process; `driver_tracking`)
    assert {int(p.name.split("-")[1]) for p in hook.glob("mlflow-*")} == {driver.pid}
    # the trials' plots were drawn, by the worker's plotting process: matplotlib loaded in
    # one process, neither the worker nor the driver
    assert len(list(tmp_path.rglob("curves.png"))) == 2, sorted(map(str, tmp_path.rglob("*.png")))
    with_matplotlib = {int(p.name.split("-")[1]) for p in hook.glob("matplotlib-*")}
    assert len(with_matplotlib) == 1 and not with_matplotlib & (loaded | {driver.pid}), with_matplotlib
