"""docker-compose.yml, Dockerfile and .env.example, checked without a Docker engine:
the Compose Specification schema (vendored in compose_spec/, see SOURCE.md there) and the
deployment's own rules — ports on 127.0.0.1 only, no secret literal, healthchecks, a GPU
reservation of every GPU for the one worker per host, every variable documented in
.env.example."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES = COMPOSE["services"]
ENV_EXAMPLE = ROOT / ".env.example"
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY$")
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def interpolate(node, env: dict[str, str]):
    """Compose's variable substitution: ${VAR}, ${VAR:-default}, ${VAR:?error}, $$."""
    if isinstance(node, dict):
        return {k: interpolate(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(v, env) for v in node]
    if not isinstance(node, str):
        return node

    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        value = env.get(name)
        if op and op.endswith("?") and not value:
            raise KeyError(f"{name}: {arg}")
        if op and op.endswith("-") and not value:
            return arg
        return value or ""

    return VAR.sub(sub, node.replace("$$", "\0")).replace("\0", "$")


def _strings(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


@pytest.fixture(scope="module")
def validator():
    import jsonschema

    schema = json.loads((HERE / "compose_spec" / "compose-spec.json").read_text())
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


def test_compose_file_matches_the_compose_specification(validator):
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(COMPOSE)]
    assert not errors, "\n".join(errors)
    resolved = interpolate(COMPOSE, env_example())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(resolved)]
    assert not errors, "\n".join(errors)


def test_the_schema_catches_mistakes(validator):
    broken = json.loads(json.dumps(COMPOSE))
    broken["services"]["mlflow"]["helthcheck"] = broken["services"]["mlflow"].pop("healthcheck")
    assert any("helthcheck" in e.message for e in validator.iter_errors(broken))


def test_the_topology():
    assert {"postgres", "mlflow", "ray-head", "ray-worker", "prometheus", "grafana", "optuna-dashboard"} <= set(SERVICES)
    assert SERVICES["optuna-dashboard"].get("profiles") == ["dashboard"]  # optional
    assert SERVICES["postgres"]["image"].startswith("postgres:15")
    for name in ("mlflow", "ray-head", "ray-worker", "optuna-dashboard"):
        assert SERVICES[name]["build"]["dockerfile"] == "Dockerfile", name
    assert set(COMPOSE["volumes"]) >= {"postgres-data", "mlflow-artifacts", "ray-storage", "ray-tmp",
                                       "prometheus-data", "grafana-data"}


def test_every_depends_on_target_exists_and_there_is_no_cycle():
    graph = {}
    for name, svc in SERVICES.items():
        deps = svc.get("depends_on", {})
        graph[name] = list(deps) if isinstance(deps, (list, dict)) else []
        for dep in graph[name]:
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
            if isinstance(deps, dict):
                assert deps[dep]["condition"] == "service_healthy", f"{name} → {dep}"
                assert "healthcheck" in SERVICES[dep], dep
    done: set[str] = set()

    def visit(node: str, stack: tuple[str, ...]) -> None:
        assert node not in stack, f"depends_on cycle: {' → '.join((*stack, node))}"
        if node not in done:
            for dep in graph[node]:
                visit(dep, (*stack, node))
            done.add(node)

    for name in graph:
        visit(name, ())


def test_every_service_has_a_healthcheck():
    for name, svc in SERVICES.items():
        check = svc.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), name
    assert "pg_isready" in " ".join(SERVICES["postgres"]["healthcheck"]["test"])
    assert "/health" in " ".join(SERVICES["mlflow"]["healthcheck"]["test"])


def _published(svc: dict, env: dict[str, str]) -> list[tuple[str, str, str]]:
    """(host ip, host port, container port) of every published port."""
    out = []
    for port in interpolate(svc.get("ports", []), env):
        if isinstance(port, dict):
            out.append((port.get("host_ip", ""), str(port.get("published", "")), str(port["target"])))
            continue
        parts = str(port).split(":")
        if len(parts) == 3:
            out.append(tuple(parts))
        elif len(parts) == 2:
            out.append(("", parts[0], parts[1]))
        else:  # "5000": a random host port on every interface
            out.append(("", "", parts[0]))
    return out


def test_every_published_port_is_bound_to_localhost():
    env = env_example()
    for name, svc in SERVICES.items():
        for host_ip, host_port, target in _published(svc, env):
            assert host_ip == "127.0.0.1", f"{name} publishes {target} on {host_ip or 'all interfaces'}"
            assert host_port, f"{name}: {target} published on a random port"
        assert "network_mode" not in svc, name  # host networking would bypass the bindings


def test_ray_internals_are_not_published():
    env = env_example()
    head = {target for _, _, target in _published(SERVICES["ray-head"], env)}
    assert head == {"8265", "10001"}  # dashboard / job API and ray:// client, both on 127.0.0.1
    assert not SERVICES["ray-worker"].get("ports")
    assert {t for _, _, t in _published(SERVICES["postgres"], env)} == {"5432"}


# Docker does not split GPUs between the replicas of a service: every replica of a service
# reserving `count: 1` gets the same first GPU (docker/compose#11863,
# NVIDIA/nvidia-container-toolkit#521). So a GPU worker owns every GPU of its host and Ray
# shares them out; more GPUs means more hosts, never `--scale`.
SCALE_ADVICE = re.compile(r"--scale[\s=]+ray-worker|\bscale:\s*[2-9]|\breplicas:\s*[2-9]")


def gpu_devices(svc: dict) -> list[dict]:
    devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [d for d in devices if d.get("driver") == "nvidia" or "gpu" in d.get("capabilities", [])]


def gpu_layout_problems(services: dict, texts: dict[str, str]) -> list[str]:
    """Why the GPU workers would not use every GPU: a reservation of a number of GPUs (each
    replica would get the same ones), replicas or scaling advice for a GPU service, a
    `ray start` told to see fewer GPUs than it got. ``texts``: documents to scan for advice
    to `--scale ray-worker` (the compose file's comments, the README)."""
    problems = []
    for name, svc in services.items():
        for device in gpu_devices(svc):
            if device.get("count") != "all" and not device.get("device_ids"):
                problems.append(f"{name}: reserves count: {device.get('count')!r}; reserve count: all "
                                "(or explicit device_ids), one worker per host")
            if device.get("count") is not None and device.get("device_ids"):
                problems.append(f"{name}: count and device_ids together")
        if gpu_devices(svc):
            if svc.get("scale", 1) != 1 or svc.get("deploy", {}).get("replicas", 1) != 1:
                problems.append(f"{name}: more than one replica of a GPU service shares the same GPUs")
            if any(str(arg).startswith("--num-gpus") for arg in svc.get("command", [])):
                problems.append(f"{name}: --num-gpus hides GPUs from Ray; `ray start` detects them")
    for where, text in texts.items():
        for match in SCALE_ADVICE.finditer(text):
            problems.append(f"{where}: advises {match.group(0)!r}; replicas of a GPU service share one GPU")
    return problems


def test_one_gpu_worker_per_host_owns_every_gpu():
    devices = gpu_devices(SERVICES["ray-worker"])
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert [name for name, svc in SERVICES.items() if gpu_devices(svc)] == ["ray-worker"]
    texts = {"docker-compose.yml": COMPOSE_TEXT, "README.md": (ROOT / "README.md").read_text(),
             ".env.example": ENV_EXAMPLE.read_text()}
    assert gpu_layout_problems(SERVICES, texts) == []


def test_the_old_scaled_one_gpu_worker_is_caught():
    old = json.loads(json.dumps(SERVICES))
    old["ray-worker"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] = 1
    advice = "docker compose up -d --build --scale ray-worker=2          # 2 GPUs → 2 workers"
    problems = gpu_layout_problems(old, {"README.md": advice})
    assert any("reserves count: 1" in p for p in problems), problems
    assert any("advises '--scale ray-worker'" in p for p in problems), problems
    old["ray-worker"]["deploy"]["resources"]["reservations"]["devices"][0].update(count=None, device_ids=["0", "1"])
    assert gpu_layout_problems(old, {}) == []  # explicit GPUs are fine
    old["ray-worker"]["deploy"]["replicas"] = 2
    old["ray-worker"]["command"] = [*old["ray-worker"]["command"], "--num-gpus=1"]
    assert len(gpu_layout_problems(old, {})) == 2


def test_shared_memory_and_storage():
    for name in ("ray-head", "ray-worker"):
        assert SERVICES[name].get("shm_size"), name
        mounts = [v.split(":") for v in SERVICES[name]["volumes"]]
        assert ["ray-storage", "/shared/runs"] in [m[:2] for m in mounts], name  # shared storage path


def test_no_secret_literal_in_the_compose_file():
    for path, value in _strings(COMPOSE):
        key = path.rsplit(".", 1)[-1]
        if SECRET_NAME.search(key):
            m = VAR.fullmatch(value)
            assert m and SECRET_NAME.search(m.group(1)) and m.group(2) in (None, ":?", "?"), \
                f"{path}: a secret must come from .env as ${{NAME:?…}}, got {value!r}"
        for userinfo in re.findall(r"://[^/@\s]*:([^@/\s]*)@", value):  # passwords inside URLs
            m = VAR.fullmatch(userinfo)
            assert m and m.group(2) in (None, ":?", "?"), f"{path}: password literal in a URL"
    for match in VAR.finditer(COMPOSE_TEXT):  # no default value for a secret
        if SECRET_NAME.search(match.group(1)):
            assert match.group(2) in (None, ":?", "?"), match.group(0)


def test_env_example_documents_every_variable_and_holds_no_secret():
    env = env_example()
    used = {m.group(1) for m in VAR.finditer(COMPOSE_TEXT)}
    assert used - set(env) == set(), f"not in .env.example: {sorted(used - set(env))}"
    for key, value in env.items():
        if SECRET_NAME.search(key):
            assert value == "change-me", f"{key} in .env.example must be a placeholder"
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ".env" in ignore and ".git" in ignore  # secrets and history stay out of the image


def test_dockerfile():
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.M)
    assert base and re.fullmatch(r"pytorch/pytorch:[\d.]+-cuda[\d.]+-cudnn\d+-(runtime|devel)", base.group(1))
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.M)
    assert ".[server,dashboard]" in text and "ray[default,client]" in text
    assert re.search(r"^USER (?!root)\w+", text, re.M)  # not root
    for path in re.findall(r"^COPY (\S+)", text, re.M):
        assert (ROOT / path).exists(), path
    start = (ROOT / "deploy" / "mlflow" / "start-mlflow.sh").read_text()
    for flag in ("--app-name basic-auth", "--serve-artifacts", "--artifacts-destination", "--allowed-hosts"):
        assert flag in start, flag
    command = SERVICES["mlflow"]["command"]
    assert command == ["/opt/nalu-sweep/deploy/mlflow/start-mlflow.sh"]
    initdb = (ROOT / "deploy" / "postgres" / "init-databases.sql").read_text()
    assert "CREATE DATABASE mlflow_auth" in initdb and "CREATE DATABASE optuna" in initdb


def test_the_image_torch_is_in_pyprojects_range():
    """The base image's torch is what every container trains with (pip keeps it), so it must
    be a release pyproject.toml allows, i.e. the one CI tests (tests/test_torch_range.py)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    base = re.search(r"^ARG BASE_IMAGE=pytorch/pytorch:([\d.]+)-cuda", (ROOT / "Dockerfile").read_text(), re.M)
    assert base, "the default base must be a pytorch/pytorch:<torch>-cuda... tag"
    (torch_line,) = re.findall(r'^\s*"(torch\b[^"]*)",?\s*$', (ROOT / "pyproject.toml").read_text(), re.M)
    spec = Requirement(torch_line).specifier
    assert spec.contains(Version(base.group(1))), f"image torch {base.group(1)} is outside {spec}"


def test_the_workers_reach_the_services_by_name():
    env = SERVICES["ray-worker"]["environment"]
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert "@postgres:5432/optuna" in env["NALU_SWEEP_OPTUNA_STORAGE"]
    assert env["RAY_AUTH_MODE"] == "token"
    assert "--address=ray-head:6379" in SERVICES["ray-worker"]["command"]


def test_ray_token_auth_stays_on():
    """Ray 2.60 turns token auth on by default; compose keeps it on for every Ray process
    and takes the token from .env."""
    for name, svc in SERVICES.items():
        env = svc.get("environment", {})
        assert str(env.get("RAY_AUTH_MODE", "token")).lower() != "disabled", name
        assert "disabled" not in " ".join(map(str, svc.get("command", []))), name
    for name in ("ray-head", "ray-worker"):
        env = SERVICES[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name
        m = VAR.fullmatch(env["RAY_AUTH_TOKEN"])
        assert m and m.group(1) == "RAY_AUTH_TOKEN" and m.group(2) == ":?", name
    assert env_example()["RAY_AUTH_TOKEN"] == "change-me"


def test_ray_dashboard_client_and_gcs_are_not_public():
    env = env_example()
    for name, svc in SERVICES.items():
        for host_ip, _, target in _published(svc, env):
            if target in ("8265", "10001"):
                assert host_ip == "127.0.0.1", f"{name} publishes Ray port {target} on {host_ip or '0.0.0.0'}"
            assert target not in ("6379", "8076", "8077"), f"{name} publishes Ray's internal port {target}"
        assert not svc.get("expose") or name == "postgres", name


def test_mlflow_requires_a_login():
    start = (ROOT / "deploy" / "mlflow" / "start-mlflow.sh").read_text()
    assert re.search(r"mlflow server\s*\\?\s*--app-name basic-auth", start)
    assert "default_permission = READ" in start  # a new user cannot write others' runs
    env = SERVICES["mlflow"]["environment"]
    for key in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        m = VAR.fullmatch(env[key])
        assert m and m.group(2) == ":?", key  # from .env, compose stops when it is unset
    client = SERVICES["ray-worker"]["environment"]
    assert VAR.fullmatch(client["MLFLOW_TRACKING_PASSWORD"]).group(1) == "MLFLOW_ADMIN_PASSWORD"


# -- Prometheus and Grafana (docs/cluster.md) ------------------------------------------------


def _mounts(svc: dict) -> dict[str, tuple[str, bool]]:
    """``{container path: (source, read-only)}`` of a service's volumes (short syntax)."""
    out = {}
    for volume in svc.get("volumes", []):
        source, target, *mode = volume.split(":")
        out[target] = (source, mode == ["ro"])
    return out


def _from_volume(svc: dict, path: str) -> tuple[str, str] | None:
    """(volume or host source, path inside it) through which ``path`` reaches the service."""
    for target, (source, _) in sorted(_mounts(svc).items(), key=lambda m: -len(m[0])):
        if path == target or path.startswith(target.rstrip("/") + "/"):
            return source, path[len(target):].lstrip("/")
    return None


def test_prometheus_scrapes_the_ray_nodes_through_rays_service_discovery():
    prom = SERVICES["prometheus"]
    config_mount = _mounts(prom)["/etc/prometheus/prometheus.yml"]
    assert config_mount[1] and (ROOT / config_mount[0]).is_file()
    config = yaml.safe_load((ROOT / config_mount[0]).read_text())
    (job,) = config["scrape_configs"]
    (sd_file,) = [f for sd in job["file_sd_configs"] for f in sd["files"]]
    # the very file the head writes: the head's Ray temp dir (/tmp/ray), on the same volume
    assert sd_file == "/tmp/ray/prom_metrics_service_discovery.json"
    assert _from_volume(prom, sd_file) == _from_volume(SERVICES["ray-head"], sd_file) == (
        "ray-tmp", "prom_metrics_service_discovery.json")
    assert _mounts(prom)["/tmp/ray"][1], "prometheus only reads Ray's files"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]


def test_grafana_is_provisioned_with_prometheus_and_both_sets_of_dashboards():
    graf = SERVICES["grafana"]
    source, read_only = _mounts(graf)["/etc/grafana/provisioning"]
    provisioning = ROOT / source
    assert read_only and provisioning.is_dir()
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    assert datasource["name"] == "Prometheus"  # what Ray's generated dashboards select (RAY_PROMETHEUS_NAME)
    assert {t for _, _, t in _published(SERVICES["prometheus"], env_example())} == {"9090"}
    providers = {p["name"]: p["options"]["path"]
                 for p in yaml.safe_load((provisioning / "dashboards" / "dashboards.yml").read_text())["providers"]}
    # nalu-sweep's own: the repository's dashboards/ folder
    source, inside = _from_volume(graf, providers["nalu-sweep"])
    assert (source, inside) == ("./dashboards", "") and sorted((ROOT / "dashboards").glob("*.json"))
    # Ray's: generated by the head at start in its session directory, on the shared volume
    source, inside = _from_volume(graf, providers["ray"])
    assert source == "ray-tmp" and inside == "session_latest/metrics/grafana/dashboards"
    assert _from_volume(SERVICES["ray-head"], "/tmp/ray") == ("ray-tmp", "")
    assert all(ro for _, ro in (_mounts(graf)[t] for t in ("/tmp/ray", "/var/lib/grafana/dashboards/nalu-sweep")))


def test_the_ray_dashboard_finds_prometheus_and_grafana():
    head = SERVICES["ray-head"]
    env = interpolate(head["environment"], env_example())
    assert env["RAY_PROMETHEUS_HOST"] == "http://prometheus:9090"
    assert env["RAY_GRAFANA_HOST"] == "http://grafana:3000"
    grafana_port = {t: p for _, p, t in _published(SERVICES["grafana"], env_example())}["3000"]
    assert env["RAY_GRAFANA_IFRAME_HOST"] == f"http://127.0.0.1:{grafana_port}"  # where the browser reaches it
    assert "--dashboard-host=0.0.0.0" in head["command"]  # published on 127.0.0.1:8265 only
    assert "ray[default" in (ROOT / "Dockerfile").read_text()  # the dashboard and the metrics agents
    assert SERVICES["grafana"]["environment"]["GF_SECURITY_ALLOW_EMBEDDING"] == "true"


def test_every_grafana_dashboard_chooses_its_prometheus():
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dashboard = json.loads(path.read_text())
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        for panel in dashboard["panels"]:
            for where in (panel, *panel.get("targets", [])):
                assert where["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (path.name, panel["title"])
        assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"]), path.name
