"""The compose topology run natively for the `cluster` test: a private PostgreSQL 15, an
MLflow server on it (basic auth, proxied artifacts), a two-node Ray cluster on loopback.

Every process is started here in its own session and stopped here by its own id (with
the children it spawned); nothing else on the machine is touched (no `ray stop`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PG_BIN = Path(os.environ.get("NALU_SWEEP_PG_BIN", "/usr/lib/postgresql/15/bin"))
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
DB_USER = "nalu"
ADMIN_USER = "admin"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def loopback_alias_usable(ip: str) -> bool:
    """Linux routes all of 127/8 to lo; other systems may not."""
    try:
        with socket.socket() as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def wait_until(check, timeout_s: float, what: str, log: Path | None = None,
               proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            timeout_s = 0  # it died: report now
            break
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise TimeoutError(f"{what} not ready" + (f" after {timeout_s:.0f} s" if timeout_s else " (it exited)")
                       + f"\n{tail}")


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def stop_trees(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM processes we started and every process below them (all at once), then
    SIGKILL whatever is left after ``grace_s``."""
    import psutil

    pids = [pid for proc in procs for pid in (proc.pid, *_descendants(proc.pid))]
    targets = [p for p in map(_proc, pids) if p is not None]
    for p in targets:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(targets, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _proc(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def stack_missing() -> str | None:
    """Why the native PostgreSQL + MLflow server stack cannot run here (None: it can)."""
    if not (PG_BIN / "initdb").exists():
        return f"PostgreSQL server binaries not found in {PG_BIN} (set NALU_SWEEP_PG_BIN)"
    if os.geteuid() == 0 and not shutil.which("runuser"):
        return "running as root without runuser (initdb refuses root)"
    for module in ("psycopg", "flask_wtf"):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed (pip install -e '.[test]')"
    return None


@dataclass
class Cluster:
    root: Path
    pg_port: int = 0
    pg_password: str = ""
    mlflow_port: int = 0
    admin_password: str = ""
    ray_port: int = 0
    # the Ray cluster's token, as Ray's documentation gives one to every node and client of a
    # cluster (KubeRay's RAY_AUTH_TOKEN): a sweep joins it as from another machine
    ray_token: str = field(default_factory=lambda: secrets.token_hex(32))
    mlflow_workers: int = 2
    startup_s: float = 0.0  # how long the last `start_mlflow` took
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: dict[str, Path] = field(default_factory=dict)
    _pg_data: Path | None = None
    _as_postgres: list[str] = field(default_factory=list)

    # -- addresses ------------------------------------------------------------------------------
    def db_url(self, database: str) -> str:
        return f"postgresql+psycopg://{DB_USER}:{self.pg_password}@127.0.0.1:{self.pg_port}/{database}"

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def ray_address(self) -> str:
        return f"{HEAD_IP}:{self.ray_port}"

    def client_env(self) -> dict[str, str]:
        """Environment of a process that uses the stack (the sweep driver, the test)."""
        return {"MLFLOW_TRACKING_USERNAME": ADMIN_USER, "MLFLOW_TRACKING_PASSWORD": self.admin_password,
                "RAY_AUTH_TOKEN": self.ray_token, "RAY_USAGE_STATS_ENABLED": "0"}

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        self.logs[name] = log
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append(proc)
        return proc

    # -- PostgreSQL -----------------------------------------------------------------------------
    def start_postgres(self) -> None:
        import secrets

        self.pg_password = secrets.token_urlsafe(16)
        self.pg_port = free_port()
        base = self.root / "pg"
        base.mkdir()
        data, sock = base / "data", base / "sock"
        pwfile = base / "pw"
        pwfile.write_text(self.pg_password + "\n")
        if os.geteuid() == 0:  # initdb refuses to run as root: run PostgreSQL as its system user
            import pwd

            user = pwd.getpwnam("postgres")
            for p in (base, pwfile):
                os.chown(p, user.pw_uid, user.pw_gid)
            base.chmod(0o700)
            self.root.chmod(0o755)
            self._as_postgres = ["runuser", "-u", "postgres", "--"]
        self._pg_data = data
        subprocess.run([*self._as_postgres, str(PG_BIN / "initdb"), "-D", str(data), "-U", DB_USER,
                        "--pwfile", str(pwfile), "--auth-local=scram-sha-256", "--auth-host=scram-sha-256",
                        "-E", "UTF8", "--locale=C.UTF-8"], check=True, capture_output=True)
        pwfile.unlink()
        sock.mkdir()
        if self._as_postgres:
            shutil.chown(sock, "postgres", "postgres")
        log = base / "postgres.log"
        self.logs["postgres"] = log
        subprocess.run([*self._as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-w",
                        "-t", "60", "-o", f"-c listen_addresses=127.0.0.1 -p {self.pg_port} "
                        f"-c unix_socket_directories={sock} -c max_connections=60", "start"],
                       check=True, capture_output=True)
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.pg_port, user=DB_USER, password=self.pg_password,
                             dbname="postgres", autocommit=True) as conn:
            for db in ("mlflow", "mlflow_auth", "optuna"):
                conn.execute(f"CREATE DATABASE {db}")

    def stop_postgres(self) -> None:
        if self._pg_data is not None and (self._pg_data / "postmaster.pid").exists():
            subprocess.run([*self._as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(self._pg_data), "-m", "fast",
                            "-w", "stop"], capture_output=True, timeout=60)

    # -- MLflow server --------------------------------------------------------------------------
    def start_mlflow(self) -> None:
        """Start the MLflow server (``mlflow_workers`` gunicorn workers); called again after
        `stop_mlflow`, it comes back on the same port with the same backend store, artifacts
        and users (a restart)."""
        import secrets

        began = time.monotonic()

        first = not self.admin_password
        if first:
            self.admin_password = secrets.token_urlsafe(16)
            self.mlflow_port = free_port()
            self._mlflow_secret = secrets.token_hex(16)
        ini = self.root / "basic_auth.ini"
        ini.write_text("[mlflow]\ndefault_permission = READ\n"
                       f"database_uri = {self.db_url('mlflow_auth')}\nadmin_username = {ADMIN_USER}\n"
                       # one PBKDF2 check per minute instead of one per request (2 cores here)
                       "auth_cache_ttl_seconds = 60\n")
        ini.chmod(0o600)
        artifacts = self.root / "artifacts"
        artifacts.mkdir(exist_ok=True)
        env = {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_PASSWORD": self.admin_password,
               "MLFLOW_FLASK_SERVER_SECRET_KEY": self._mlflow_secret}
        proc = self._spawn("mlflow", [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
                               "--backend-store-uri", self.db_url("mlflow"), "--serve-artifacts",
                               "--artifacts-destination", artifacts.as_uri(), "--host", "127.0.0.1",
                               "--port", str(self.mlflow_port), "--workers", str(self.mlflow_workers)], env)
        self._mlflow_proc = proc
        url = f"{self.tracking_uri}/health"
        wait_until(lambda: urllib.request.urlopen(url, timeout=2).status == 200, 150, "mlflow server",
                   self.logs["mlflow"], proc)
        self.startup_s = time.monotonic() - began

    def stop_mlflow(self) -> None:
        """Stop the MLflow server (and its workers) only; `start_mlflow` brings it back."""
        proc = getattr(self, "_mlflow_proc", None)
        if proc is None:
            return
        stop_trees([proc])
        self.procs.remove(proc)
        self._mlflow_proc = None
        wait_until(lambda: not _port_open("127.0.0.1", self.mlflow_port), 30, "mlflow server stop")

    # -- Ray ------------------------------------------------------------------------------------
    def _ray_ports(self, ip: str) -> list[str]:
        low = free_port(ip)
        return ["--node-manager-port", str(free_port(ip)), "--object-manager-port", str(free_port(ip)),
                "--dashboard-agent-listen-port", str(free_port(ip)), "--dashboard-agent-grpc-port",
                str(free_port(ip)), "--runtime-env-agent-port", str(free_port(ip)),
                "--metrics-export-port", str(free_port(ip)), "--min-worker-port", "0",
                "--max-worker-port", "0"] if low else []

    def start_ray(self, env: dict[str, str] | None = None) -> None:
        """Head and worker node; ``env`` is added to both `ray start` environments (e.g. the
        GCS's ``RAY_health_check_*`` settings). Ray's default authentication: the head turns
        token authentication on, finding ``ray_token``; the worker node sets
        ``RAY_AUTH_MODE=token`` as Ray requires of a node joining by address (Ray 2.60 turns
        it on by itself only for a head)."""
        ray = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--num-cpus", "1",
               "--num-gpus", "0", "--disable-usage-stats", "--object-store-memory", str(100 * 2**20)]
        env = {"RAY_AUTH_TOKEN": self.ray_token, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        # Ray keeps sockets under its temp dir: a short path (AF_UNIX paths are ≤ 107 bytes)
        temp = Path(tempfile.mkdtemp(prefix="nsray", dir="/tmp"))
        self.ray_temp = temp
        self.ray_port = free_port(HEAD_IP)
        head = self._spawn("ray-head", [*ray, "--head", "--node-ip-address", HEAD_IP, "--port", str(self.ray_port),
                                 "--include-dashboard", "false", "--temp-dir", str(temp),
                                 *self._ray_ports(HEAD_IP)], env)
        self.ray_head = head
        wait_until(lambda: _connects(HEAD_IP, self.ray_port), 120, "ray head", self.logs["ray-head"], head)
        worker = self._spawn("ray-worker", [*ray, "--address", self.ray_address, "--node-ip-address", WORKER_IP,
                                   *self._ray_ports(WORKER_IP)], {**env, "RAY_AUTH_MODE": "token"})
        self.ray_worker = worker
        wait_until(lambda: self.alive_ray_nodes() == {HEAD_IP, WORKER_IP}, 120, "ray worker node",
                   self.logs["ray-worker"], worker)

    def worker_raylet(self):
        """The worker node's raylet (a `psutil.Process`): a child of the `ray start --block`
        started here, found by name among its descendants only."""
        import psutil

        for pid in _descendants(self.ray_worker.pid):
            p = _proc(pid)
            try:
                if p is not None and p.name() == "raylet":
                    return p
            except psutil.Error:
                continue
        raise LookupError(f"no raylet below the worker node's ray start (pid {self.ray_worker.pid})")

    def kill_worker_raylet(self) -> int:
        """SIGKILL the worker node's raylet, as if the machine died; returns its pid."""
        raylet = self.worker_raylet()
        raylet.send_signal(signal.SIGKILL)
        raylet.wait(timeout=30)
        return raylet.pid

    def alive_ray_nodes(self) -> set[str]:
        out = subprocess.run([sys.executable, "-c", (
            "import ray, sys\n"
            f"ray.init(address='{self.ray_address}', log_to_driver=False, logging_level='ERROR')\n"
            "print(','.join(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))\n")],
            capture_output=True, text=True, timeout=90,
            # a plain `ray.init` by address sends the token only in token mode (Ray's client setting)
            env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.ray_token,
                 "RAY_USAGE_STATS_ENABLED": "0"})
        lines = out.stdout.strip().splitlines()
        return set(lines[-1].split(",")) if out.returncode == 0 and lines else set()

    def stop_ray(self) -> None:
        """Stop the Ray nodes started here (and their process trees) only."""
        nodes = [p for p in (getattr(self, "ray_head", None), getattr(self, "ray_worker", None)) if p is not None]
        stop_trees(nodes, grace_s=3)
        for p in nodes:
            self.procs.remove(p)
        self.ray_head = self.ray_worker = None
        temp = getattr(self, "ray_temp", None)
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)

    # -- all ------------------------------------------------------------------------------------
    def stop(self) -> None:
        stop_trees(self.procs, grace_s=3)
        self.stop_postgres()
        temp = getattr(self, "ray_temp", None)
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def _connects(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=1):
        return True


def _port_open(host: str, port: int) -> bool:
    try:
        return _connects(host, port)
    except OSError:
        return False


def small_mul_space(name: str, *, seeds: int, steps: int, eval_every: int, trials: int,
                    retries: int = 0, checkpoint_every: int | None = None) -> str:
    """The search space the real-service tests sweep: NAU → NMU on the small
    multiplication problem, the learning rate searched, two trials at once, one CPU each."""
    checkpoint = f"checkpoint_every: {checkpoint_every}\n" if checkpoint_every is not None else ""
    return f"""
name: {name}
task: {{kind: small_mul, eval_samples: 200, threshold_samples: 1000}}
fixed:
  model: {{layers: [{{unit: nau}}, {{unit: nmu}}]}}
  train: {{batch_size: 32}}
  device: cpu
  compile: "off"
params:
  lr: {{type: loguniform, low: 1.0e-2, high: 0.3, target: train.optimizer.lr}}
seeds: {seeds}
steps: {steps}
eval_every: {eval_every}
{checkpoint}trials: {trials}
concurrency: 2
scheduler: none
resources: {{cpus: 1, gpus: 0}}
retries: {retries}
sampler: {{type: random, seed: 0}}
"""
