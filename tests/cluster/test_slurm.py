"""deploy/slurm/nalu-sweep.sbatch against a real Slurm: a private controller and two node
daemons (Debian's slurm-wlm) on loopback addresses 127.0.0.2 / 127.0.0.3, with a generated
slurm.conf in a temporary directory (its own ports, no munge: ``auth/none``), run as this
user. The script is submitted with ``sbatch`` on a tiny sweep; the test checks the job's
end, the sweep's runs in MLflow, and that no Ray process of the job is left.

Every daemon is started here in its own session and stopped here by its own id.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopback_stack  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "nalu-sweep.sbatch"
SWEEP, TRIALS = "slurm-smoke", 2
NODES = {"nalu1": "127.0.0.2", "nalu2": "127.0.0.3"}
SPACE = loopback_stack.small_mul_space(SWEEP, seeds=2, steps=200, eval_every=100, trials=TRIALS)


def slurm_conf(root: Path, ctld_port: int, node_ports: dict[str, int]) -> str:
    user, host = getpass.getuser(), socket.gethostname()
    nodes = "\n".join(f"NodeName={name} NodeHostname={host} NodeAddr={ip} Port={node_ports[name]} CPUs=1 "
                      "State=UNKNOWN" for name, ip in NODES.items())
    return f"""ClusterName=nalutest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/none
CredType=cred/none
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
MinJobAge=600
{nodes}
PartitionName=test Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _slurm_missing() -> str | None:
    for tool in ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "srun"):
        if shutil.which(tool) is None:
            return f"Slurm is not installed ({tool} not found; apt-get install slurm-wlm)"
    if not all(map(loopback_stack.loopback_alias_usable, NODES.values())):
        return "127.0.0.2 / 127.0.0.3 are not usable loopback addresses here"
    plugins = [Path(p) for p in ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm",
                                 "/usr/lib/slurm", "/usr/lib64/slurm")]
    if not any((p / "auth_none.so").exists() for p in plugins):
        return "this Slurm build has no auth/none plugin"
    return None


@pytest.fixture(scope="module")
def slurm():
    why = _slurm_missing()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="nsslurm", dir="/tmp"))  # Ray's sockets below: a short path
    (root / "state").mkdir()
    (root / "spool").mkdir()
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, loopback_stack.free_port(), {n: loopback_stack.free_port(ip) for n, ip in NODES.items()}))
    env = {"SLURM_CONF": str(conf)}
    stack = loopback_stack.Cluster(root)
    try:
        ctld = stack._spawn("slurmctld", ["slurmctld", "-D", "-f", str(conf)], env)
        loopback_stack.wait_until(lambda: _sinfo(env) is not None, 30, "slurmctld", stack.logs["slurmctld"], ctld)
        for name in NODES:
            stack._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", str(conf)], env)
        loopback_stack.wait_until(lambda: _sinfo(env) == ["idle"] * len(NODES), 60, "slurmd (both nodes idle)",
                                  root / "slurmctld.log")
        yield root, env
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)


def _sinfo(env: dict[str, str]) -> list[str] | None:
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=10,
                          env={**os.environ, **env})
    return sorted(proc.stdout.split()) if proc.returncode == 0 else None


def _job(job_id: str, env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=10,
                         env={**os.environ, **env}).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def test_the_batch_script_runs_a_sweep_on_two_slurm_nodes(slurm):
    root, slurm_env = slurm
    work = root / "work"
    work.mkdir()
    (work / "space.yaml").write_text(SPACE)
    tracking = f"sqlite:///{work / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_", "SLURM_"))}
    # Ray's default authentication: the script generates the job's token in this home of its own
    (root / "home").mkdir()
    env.update(slurm_env, HOME=str(root / "home"), RAY_USAGE_STATS_ENABLED="0", TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1",
               RAY_PORT=str(loopback_stack.free_port(NODES["nalu1"])), RAY_TEMP_DIR=str(root / "ray"),
               RAY_START_ARGS=f"--min-worker-port=0 --max-worker-port=0 --object-store-memory={100 * 2**20}",
               RAY_NODE_WAIT_S="90",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--cpus-per-task=1", f"--output={work / 'job.out'}", f"--chdir={work}",
         str(SCRIPT), "space.yaml", "--tracking-uri", tracking, "--storage-path", str(work / "runs")],
        capture_output=True, text=True, timeout=30, env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]

    deadline = time.monotonic() + 240
    job = _job(job_id, slurm_env)
    while job.get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") and time.monotonic() < deadline:
        time.sleep(2)
        job = _job(job_id, slurm_env)
    output = (work / "job.out").read_text(errors="replace") if (work / "job.out").exists() else ""
    assert job.get("JobState") == "COMPLETED" and job.get("ExitCode") == "0:0", f"{job}\n{output[-4000:]}"
    assert "2 node(s)" in output
    assert (root / "home" / ".ray" / "auth_token").is_file()  # the cluster ran with the job's token

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking)
    experiment = client.get_experiment_by_name(SWEEP)
    runs = client.search_runs([experiment.experiment_id])
    trials = [r for r in runs if r.data.tags.get("nalu_sweep.role") == "trial"]
    parents = [r for r in runs if r.data.tags.get("nalu_sweep.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(trials) == TRIALS and all(r.info.status == "FINISHED" for r in trials)
    from service.tracking.store import TAG_NODE

    assert {r.data.tags.get(TAG_NODE) for r in trials} <= set(NODES.values())  # on the Slurm nodes' Ray

    # a clean stop: no process of the job's Ray nodes is left
    import psutil

    left = []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(root / "ray") in part for part in (p.info["cmdline"] or [])):
            left.append((p.pid, " ".join(p.info["cmdline"])[:120]))
    assert not left, left


def test_the_batch_script_refuses_to_run_without_a_search_space(slurm, tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage: sbatch" in proc.stderr
