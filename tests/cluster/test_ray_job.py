"""A sweep run as a Ray job, as docs/cluster.md tells a user to (issue 43): a head started
with ``ray start --head`` and Ray's default authentication (a token on its machine, so
token authentication is on), its dashboard serving the job API (``ray[default]`` on the
head, `ray_default`), and ``ray job submit --address http://127.0.0.1:<dashboard port> --
nalu-sweep sweep ...`` from another machine with the token in its environment. The job
must succeed, its logs end with the sweep's answer, and the sweep's MLflow store hold the
finished trial. A wrong token is refused by Ray's CLI, saying so.

The head is this module's own: a home of its own (where ``ray get-auth-token --generate``
writes the token, so the user's ~/.ray is not touched), a temp directory of its own, free
ports, stopped by its own process tree (``ray stop`` would stop every Ray on the machine).
"Another machine" is a process with another home: no token file, only what it is given.
The submitting side uses this environment's ``ray`` (this package's dependencies, without
``ray[default]``): the job API needs the dashboard only on the head.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopback_stack  # noqa: E402
import ray_default  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY_CLI = str(Path(sys.executable).with_name("ray"))
SWEEP = "job"
SPACE = loopback_stack.small_mul_space(SWEEP, seeds=2, steps=20, eval_every=10, trials=2)  # --trials 1 below
# what decides how a Ray client authenticates and which cluster it finds: set per process here
RAY_CLIENT_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")


def _dashboard_up(url: str) -> bool:
    """The dashboard answers (401 without a token: token authentication is on)."""
    try:
        urllib.request.urlopen(f"{url}/api/version", timeout=2)
    except urllib.error.HTTPError as e:
        return e.code == 401
    return True


@pytest.fixture(scope="module")
def head():
    """``ray start --head`` with the dashboard and Ray's default authentication: yields the
    dashboard's URL, the token (as ``ray get-auth-token`` prints it on the head), the
    client environment without any of Ray's settings, and the module's temp directory."""
    python, why = ray_default.ray_default_python()
    if python is None:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="nsjob", dir="/tmp"))  # short: Ray's socket paths
    home = root / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in RAY_CLIENT_ENV and not k.startswith("MLFLOW_")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1")
    # the head's node: Ray with ray[default] (the venv's python, first on PATH) and this package
    # installed (its `nalu-sweep` beside this interpreter; its source on PYTHONPATH, which the
    # side environment's .pth does not give, for the trials' workers)
    head_env = {**env, "PATH": os.pathsep.join([str(python.parent), str(Path(sys.executable).parent), env["PATH"]]),
                "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # Ray's documentation, for a cluster not started by ray.init(): generate the token first;
    # `ray start --head` then finds it in ~/.ray/auth_token and turns token authentication on
    subprocess.run([RAY_CLI, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=60)
    port, dash_port = loopback_stack.free_port(), loopback_stack.free_port()
    url = f"http://127.0.0.1:{dash_port}"
    log = root / "ray-head.log"
    with open(log, "wb") as out:
        started = subprocess.Popen(
            [str(python), "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
             "--port", str(port), "--num-cpus", "2", "--num-gpus", "0", "--disable-usage-stats",
             "--object-store-memory", str(100 * 2**20), "--temp-dir", str(root / "ray"),
             "--include-dashboard", "true", "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash_port)],
            cwd=root, env=head_env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        loopback_stack.wait_until(lambda: _dashboard_up(url), 180, "the head's dashboard", log, started)
        assert "Token authentication is enabled" in log.read_text(errors="replace")
        token = subprocess.run([RAY_CLI, "get-auth-token"], env=env, check=True, capture_output=True, text=True,
                               timeout=60).stdout.strip()
        yield {"url": url, "token": token, "env": env, "root": root, "log": log}
    finally:
        loopback_stack.stop_trees([started], grace_s=5)
        shutil.rmtree(root, ignore_errors=True)


def _elsewhere(head: dict, tmp_path: Path, **given: str) -> dict[str, str]:
    """The environment of a machine that only knows what it is ``given``: its own home."""
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    return {**head["env"], "HOME": str(tmp_path / "elsewhere"), **given}


def _ray_job(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([RAY_CLI, "job", *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, check=False)


def test_a_sweep_runs_as_a_ray_job_with_the_token(head, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job_id = f"nalu-sweep-{secrets.token_hex(4)}"
    # docs/cluster.md: export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=..., then ray job submit
    there = _elsewhere(head, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head["token"])
    submitted = _ray_job(["submit", "--address", head["url"], "--submission-id", job_id, "--",
                          "nalu-sweep", "sweep", str(space), "--trials", "1", "--tracking-uri", tracking,
                          "--storage-path", str(tmp_path / "runs")], there, tmp_path)
    said = f"{submitted.stdout}\n--- head\n{head['log'].read_text(errors='replace')[-3000:]}"
    assert submitted.returncode == 0, said  # `ray job submit` waits for the job: 0 once it succeeded
    assert f"Job '{job_id}' succeeded" in submitted.stdout, said

    status = _ray_job(["status", "--address", head["url"], job_id], there, tmp_path)
    assert status.returncode == 0 and "succeeded" in status.stdout, status.stdout

    logs = _ray_job(["logs", "--address", head["url"], job_id], there, tmp_path)
    assert logs.returncode == 0, logs.stdout
    lines = [line for line in logs.stdout.splitlines() if line.strip()]
    # the driver ran on the head and joined its Ray (not a Ray of its own)
    assert any(line.startswith("connected to the running Ray") for line in lines), logs.stdout
    assert not any("started a local Ray" in line for line in lines), logs.stdout
    completed = [i for i, line in enumerate(lines) if line.startswith("sweep job completed: 1 completed, 0 pruned, 0 failed")]
    best = [i for i, line in enumerate(lines) if line.startswith("best setting: lr=")]
    assert completed and best and completed[0] < best[0], logs.stdout  # the sweep's answer, at its end
    assert "Traceback" not in logs.stdout, logs.stdout

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking)
    experiment = client.get_experiment_by_name(SWEEP)
    assert experiment is not None, logs.stdout
    trials = [r for r in client.search_runs([experiment.experiment_id])
              if r.data.tags.get("nalu_sweep.role") == "trial"]
    assert len(trials) == 1 and trials[0].info.status == "FINISHED", [(r.info.run_name, r.info.status) for r in trials]
    key = trials[0].data.tags.get("nalu_sweep.trial_key")
    assert key and f"(trial-{key})" in lines[best[0]], (lines[best[0]], trials[0].data.tags)


@pytest.mark.parametrize("given, says", [
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "wrong"}, "invalid authentication token"),
    # Ray 2.60's CLI sends a token only in token mode, even when RAY_AUTH_TOKEN is set: why
    # docs/cluster.md exports RAY_AUTH_MODE=token beside the token for `ray job submit`
    ({"RAY_AUTH_TOKEN": None}, "missing authentication token"),
], ids=["wrong-token", "token-without-token-mode"])
def test_ray_job_submit_without_the_right_token_is_refused(head, tmp_path, given, says):
    given = {k: (head["token"] if v is None else v) for k, v in given.items()}
    refused = _ray_job(["submit", "--address", head["url"], "--", "nalu-sweep", "--help"],
                       _elsewhere(head, tmp_path, **given), tmp_path)
    assert refused.returncode != 0, refused.stdout
    assert says in refused.stdout.lower() and "RAY_AUTH_TOKEN" in refused.stdout, refused.stdout
    assert "submitted successfully" not in refused.stdout, refused.stdout
