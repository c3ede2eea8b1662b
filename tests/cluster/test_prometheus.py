"""The metrics path for real: a local Ray head with its metrics agent (``ray[default]``,
`ray_default`), Debian's ``prometheus`` run natively with the compose stack's
configuration, scraping the nodes Ray's service-discovery file lists, and a small sweep driven against that Ray. The sweep's own
figures (`service.sweep.metrics`) and Ray's node metrics must arrive in Prometheus, agree
with the sweep's MLflow runs, and every query of ``dashboards/*.json`` must name metrics
that the scrape returned.

Everything is started here in its own session and stopped here by its own id.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopback_stack  # noqa: E402
import ray_default  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"  # docker-compose.yml's
# each trial trains for several seconds, so that at least one export (every second) and one
# scrape (every second) fall inside it: with 2,000 steps a trial could end between two
# (once in a clean-clone run, a trial's rate never reached Prometheus above 0)
SWEEP, SEEDS, STEPS, TRIALS = "prom-smoke", 2, 8000, 2
SPACE = loopback_stack.small_mul_space(SWEEP, seeds=SEEDS, steps=STEPS, eval_every=500, trials=TRIALS)
OWN = {"ray_nalu_sweep_trials", "ray_nalu_sweep_seed_steps_per_second", "ray_nalu_sweep_seed_steps_total",
       "ray_nalu_sweep_seeds_solved"}
# reported by Ray only on nodes that have GPUs (Ray's node metrics); excused on a CPU-only run
GPU_ONLY = {"ray_node_gpus_utilization", "ray_node_gram_used", "ray_node_gram_available"}
FAST_METRICS = {"RAY_metrics_report_interval_ms": "1000"}  # Ray's metrics flushed every second


def dashboard_queries() -> dict[str, list[str]]:
    """``{dashboard file: every PromQL query in it}`` (panel targets and template variables)."""
    out = {}
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        queries = []

        def walk(node):
            if isinstance(node, dict):
                for key, value in node.items():
                    if key == "expr" and isinstance(value, str):
                        queries.append(value)
                    elif key == "query" and isinstance(value, dict) and "query" in value:
                        queries.append(value["query"])
                    else:
                        walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(json.loads(path.read_text()))
        out[path.name] = queries
    return out


def metric_names(query: str) -> set[str]:
    """The metrics a query names: every name in it starts with ``ray_`` (Ray's prefix)."""
    return set(re.findall(r"\bray_[A-Za-z0-9_:]+", query))


def shipped_config(discovery: Path) -> str:
    """The compose stack's Prometheus configuration, reading ``discovery`` instead of the
    head's /tmp/ray file and scraping every second."""
    import yaml

    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"]["scrape_interval"] = "1s"
    for job in config["scrape_configs"]:
        for sd in job["file_sd_configs"]:
            assert sd["files"] == ["/tmp/ray/prom_metrics_service_discovery.json"]
            sd["files"], sd["refresh_interval"] = [str(discovery)], "1s"
    return yaml.safe_dump(config)


def test_the_shipped_prometheus_config_is_valid():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("Debian's prometheus (promtool) is not installed")
    proc = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_dashboard_query_names_a_ray_metric():
    queries = dashboard_queries()
    assert "nalu-sweep.json" in queries
    for name, found in queries.items():
        assert found, name
        for query in found:
            assert metric_names(query), f"{name}: {query!r} names no ray_ metric"
    named = set().union(*(metric_names(q) for qs in queries.values() for q in qs))
    assert OWN <= named  # the sweep's own figures are all drawn


@pytest.fixture(scope="module")
def prometheus_stack():
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus)")
    python, why = ray_default.ray_default_python()
    if python is None:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="nsprom", dir="/tmp"))  # Ray's sockets: a short path
    stack = loopback_stack.Cluster(root)
    # Ray's default authentication: the head finds this token and turns token authentication on
    env = {"RAY_AUTH_TOKEN": stack.ray_token, "RAY_USAGE_STATS_ENABLED": "0", **FAST_METRICS,
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    ray_temp = root / "ray"
    port, metrics_port, dash_port = (loopback_stack.free_port() for _ in range(3))
    try:
        head = stack._spawn("ray-head", [
            str(python), "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
            "--port", str(port), "--num-cpus", "2", "--num-gpus", "0", "--disable-usage-stats",
            "--object-store-memory", str(100 * 2**20), "--temp-dir", str(ray_temp),
            "--metrics-export-port", str(metrics_port), "--include-dashboard", "true",
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash_port)], env)
        discovery = ray_temp / "prom_metrics_service_discovery.json"
        loopback_stack.wait_until(lambda: discovery.exists() and json.loads(discovery.read_text())[0]["targets"],
                                  120, "ray head and its service-discovery file", stack.logs["ray-head"], head)
        # the node's metrics agent up and listed (it exports the node's figures and the
        # drivers'): the head lists it only once it is up, Prometheus may read the file before
        host = json.loads(discovery.read_text())[0]["targets"][0].rsplit(":", 1)[0]
        agent = f"{host}:{metrics_port}"
        loopback_stack.wait_until(
            lambda: agent in json.loads(discovery.read_text())[0]["targets"]
            and b"ray_node_cpu_utilization" in urllib.request.urlopen(f"http://{agent}/metrics", timeout=2).read(),
            120, "the head's metrics agent", stack.logs["ray-head"], head)
        prom_port = loopback_stack.free_port()
        config = root / "prometheus.yml"
        config.write_text(shipped_config(discovery))
        prom = stack._spawn("prometheus", [prometheus, f"--config.file={config}", f"--storage.tsdb.path={root / 'tsdb'}",
                                           f"--web.listen-address=127.0.0.1:{prom_port}"])
        url = f"http://127.0.0.1:{prom_port}"
        loopback_stack.wait_until(lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200, 60,
                                  "prometheus", stack.logs["prometheus"], prom)
        yield {"python": python, "env": env, "address": f"127.0.0.1:{port}", "url": url, "root": root,
               "discovery": discovery, "stack": stack}
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)


def _api(url: str, path: str, **params) -> object:
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}/api/v1/{path}?{query}", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def _value(url: str, query: str) -> float | None:
    result = _api(url, "query", query=query)["result"]
    return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def swept(prometheus_stack):
    """The sweep, driven with --address against the Ray above, from a driver process that
    connects to that Ray itself first and stays connected a few seconds after the sweep, so
    that Ray exports the sweep's last figures (a sweep disconnects at its end only from a
    Ray it connected to itself; Ray exports a process's metrics every few seconds)."""
    work = prometheus_stack["root"] / "work"
    work.mkdir()
    (work / "space.yaml").write_text(SPACE)
    tracking = f"sqlite:///{work / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    # the driver's own plain `ray.init` by address sends the token only in token mode (Ray's client setting)
    env.update(prometheus_stack["env"], RAY_AUTH_MODE="token", TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1", COLUMNS="200")
    driver = ("import sys, time\nimport ray\n"
              f"ray.init(address={prometheus_stack['address']!r}, log_to_driver=False)\n"
              "from service.cli import app\n"
              "try:\n    app(sys.argv[1:], standalone_mode=False)\nfinally:\n    time.sleep(5)\n")
    cmd = [str(prometheus_stack["python"]), "-c", driver, "sweep", "space.yaml", "--address",
           prometheus_stack["address"], "--tracking-uri", tracking, "--storage-path", str(work / "runs")]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    logs = prometheus_stack["stack"].logs
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n" + "\n".join(
        f"--- {n}\n{p.read_text(errors='replace')[-2000:]}" for n, p in logs.items() if p.exists())
    time.sleep(3)  # a last scrape
    return {**prometheus_stack, "tracking": tracking, "driver_log": proc.stdout[-3000:] + proc.stderr[-5000:]}


def test_the_sweeps_figures_and_rays_arrive_in_prometheus(swept):
    url = swept["url"]
    names = set(_api(url, "label/__name__/values"))
    assert OWN <= names, (f"{sorted(OWN - names)} missing; Prometheus's targets: {_api(url, 'targets')}\n"
                          f"the driver said: {swept['driver_log']}")
    assert {"ray_node_cpu_utilization", "ray_resources", "ray_node_mem_used"} <= names

    sel = f'sweep="{SWEEP}"'
    assert _value(url, f'max(max_over_time(ray_nalu_sweep_trials{{{sel},state="done"}}[15m]))') == TRIALS
    assert _value(url, f'max(max_over_time(ray_nalu_sweep_trials{{{sel},state="running"}}[15m]))') >= 1
    assert _value(url, f'max(max_over_time(ray_nalu_sweep_trials{{{sel},state="failed"}}[15m]))') == 0
    # every seed's every step, counted once: seeds × steps × trials
    assert _value(url, f"sum(max_over_time(ray_nalu_sweep_seed_steps_total{{{sel}}}[15m]))") == SEEDS * STEPS * TRIALS

    rates = _api(url, "query", query=f"max_over_time(ray_nalu_sweep_seed_steps_per_second{{{sel}}}[15m])")["result"]
    assert len({r["metric"]["trial"] for r in rates}) == TRIALS
    assert all(float(r["value"][1]) > 0 for r in rates)
    hosts = {t.rsplit(":", 1)[0] for t in json.loads(swept["discovery"].read_text())[0]["targets"]}
    assert {r["metric"]["node"] for r in rates} <= hosts  # the node a trial trained on, as Ray names it
    assert _value(url, f"max(last_over_time(ray_nalu_sweep_seed_steps_per_second{{{sel}}}[15m]))") == 0  # all ended

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=swept["tracking"])
    experiment = client.get_experiment_by_name(SWEEP)
    trials = [r for r in client.search_runs([experiment.experiment_id])
              if r.data.tags.get("nalu_sweep.role") == "trial"]
    assert len(trials) == TRIALS
    solved = sum(int(r.data.metrics["successes"]) for r in trials)
    assert _value(url, f"max(last_over_time(ray_nalu_sweep_seeds_solved{{{sel}}}[15m]))") == solved


def test_every_dashboard_query_names_a_metric_the_scrape_returned(swept):
    names = set(_api(swept["url"], "label/__name__/values"))
    has_gpu = _value(swept["url"], 'count(ray_resources{Name="GPU"})') is not None
    for dashboard, queries in dashboard_queries().items():
        for query in queries:
            missing = metric_names(query) - names - (set() if has_gpu else GPU_ONLY)
            assert not missing, f"{dashboard}: {query!r} names {sorted(missing)}, not in the scrape"
        # and Prometheus accepts the query (Grafana's variables given plain values)
        for query in queries:
            plain = query.replace("$__rate_interval", "1m").replace("$sweep", SWEEP).replace("$session", ".+")
            plain = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", plain)  # a variable's: its series
            _api(swept["url"], "query", query=plain)
