"""deploy/kuberay/, checked without a Kubernetes cluster: the RayCluster and RayJob against
KubeRay's CRD schemas (vendored in kuberay_crd/, see SOURCE.md there; unknown fields
rejected as kubectl's strict field validation does), and the manifests against the compose
stack: the same images, commands and environment (secrets from compose's .env keys)."""

from __future__ import annotations

import copy
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_compose import env_example, interpolate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
KUBERAY = ROOT / "deploy" / "kuberay"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
SECRET_NAME = "nalu-sweep"  # made from compose's .env: kubectl create secret generic nalu-sweep --from-env-file=.env
CLUSTER_SPEC_REF = {"$ref": "raycluster.v1.json#/properties/spec"}


def _interpolate(node):
    return interpolate(node, env_example())


def manifests() -> list[tuple[str, dict]]:
    return [(path.name, doc) for path in sorted(KUBERAY.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def of_kind(kind: str) -> list[dict]:
    return [doc for _, doc in manifests() if doc.get("kind") == kind]


def strict(schema):
    """Unknown fields rejected, as ``kubectl`` (field validation ``Strict``) does: structural
    schemas never say so themselves."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def validators():
    import jsonschema

    cluster = json.loads((HERE / "kuberay_crd" / "raycluster.v1.json").read_text())
    job = json.loads((HERE / "kuberay_crd" / "rayjob.v1.json").read_text())
    spec = job["properties"]["spec"]["properties"]
    assert spec["rayClusterSpec"] == CLUSTER_SPEC_REF  # SOURCE.md: the one part stored once
    spec["rayClusterSpec"] = copy.deepcopy(cluster["properties"]["spec"])
    out = {}
    for kind, schema in (("RayCluster", cluster), ("RayJob", job)):
        schema = strict(schema)
        jsonschema.Draft7Validator.check_schema(schema)
        out[kind] = jsonschema.Draft7Validator(schema)
    return out


def _errors(validator, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_the_ray_resources_match_kuberays_schemas(validators):
    kinds = [doc["kind"] for _, doc in manifests() if doc.get("apiVersion") == "ray.io/v1"]
    assert sorted(kinds) == ["RayCluster", "RayJob"]
    for name, doc in manifests():
        if doc.get("apiVersion") == "ray.io/v1":
            errors = _errors(validators[doc["kind"]], doc)
            assert not errors, f"{name} {doc['kind']}:\n" + "\n".join(errors)


def test_the_schemas_catch_mistakes(validators):
    (cluster,) = of_kind("RayCluster")
    typo = copy.deepcopy(cluster)
    typo["spec"]["workerGroupSpecs"][0]["maxReplica"] = typo["spec"]["workerGroupSpecs"][0].pop("maxReplicas")
    assert any("maxReplica" in e for e in _errors(validators["RayCluster"], typo))
    wrong = copy.deepcopy(cluster)
    wrong["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] = 2  # ray start params are strings
    assert _errors(validators["RayCluster"], wrong)
    container = copy.deepcopy(cluster)
    container["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imag"] = "x"
    assert _errors(validators["RayCluster"], container)
    (job,) = of_kind("RayJob")
    bad = copy.deepcopy(job)
    bad["spec"]["shutdownAfterJobFinishes"] = "no"
    assert _errors(validators["RayJob"], bad)


def _containers(doc: dict) -> dict[str, dict]:
    """``{container name: container}`` of a Deployment or of a RayCluster's groups."""
    if doc["kind"] == "RayCluster":
        groups = [doc["spec"]["headGroupSpec"], *doc["spec"]["workerGroupSpecs"]]
        return {c["name"]: c for g in groups for c in g["template"]["spec"]["containers"]}
    return {c["name"]: c for c in doc["spec"]["template"]["spec"]["containers"]}


def resolved_env(container: dict) -> dict[str, str]:
    """A container's environment as Kubernetes sets it: secret keys of "nalu-sweep" read from
    compose's .env.example, ``$(NAME)`` replaced by an earlier variable."""
    example = env_example()
    out: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == SECRET_NAME, var
            assert ref["key"] in example, f"{var['name']}: {ref['key']} is not a key of .env.example"
            out[var["name"]] = example[ref["key"]]
        else:
            out[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: out.get(m.group(1), m.group(0)), var["value"])
    return out


def _compose_image(name: str) -> str:
    return _interpolate(COMPOSE[name])["image"]


def test_the_images_are_the_compose_stacks():
    (cluster,) = of_kind("RayCluster")
    deployments = {d["metadata"]["name"]: d for d in of_kind("Deployment")}
    assert _containers(deployments["postgres"])["postgres"]["image"] == COMPOSE["postgres"]["image"]
    built = _compose_image("mlflow")  # nalu-sweep:latest, built from ./Dockerfile
    assert _containers(deployments["mlflow"])["mlflow"]["image"] == built
    for name, container in _containers(cluster).items():
        assert container["image"] == built, name
    assert cluster["spec"]["rayVersion"] == re.search(r'"ray\[default,client\]==([\d.]+)\.\*"',
                                                      (ROOT / "Dockerfile").read_text()).group(1) + ".0"


def test_the_commands_are_the_compose_stacks():
    deployments = {d["metadata"]["name"]: d for d in of_kind("Deployment")}
    assert _containers(deployments["mlflow"])["mlflow"]["command"] == COMPOSE["mlflow"]["command"]
    (cluster,) = of_kind("RayCluster")
    # the head's `ray start` options are compose's (KubeRay writes --head, --port=6379, --block)
    head_flags = dict(a.lstrip("-").split("=", 1) for a in _interpolate(COMPOSE["ray-head"])["command"] if "=" in a)
    params = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    for key in ("dashboard-host", "num-cpus", "num-gpus", "ray-client-server-port"):
        assert params[key] == head_flags[key], key
    assert head_flags["port"] == "6379"  # KubeRay's default GCS port
    # a GPU worker sees every GPU of its pod (compose: `ray start` detects them, no --num-gpus)
    (workers,) = cluster["spec"]["workerGroupSpecs"]
    assert "num-gpus" not in workers["rayStartParams"]
    (worker,) = _containers({"kind": "RayCluster", "spec": {"headGroupSpec": {"template": {"spec": {"containers": []}}},
                                                             "workerGroupSpecs": [workers]}}).values()
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == worker["resources"]["requests"]["nvidia.com/gpu"]
    (init,) = [c["data"]["10-databases.sql"] for c in of_kind("ConfigMap")]
    assert init == (ROOT / "deploy" / "postgres" / "init-databases.sql").read_text()


def test_the_environment_is_the_compose_stacks():
    (cluster,) = of_kind("RayCluster")
    compose_ray = _interpolate(COMPOSE["ray-worker"]["environment"])
    # token auth as in compose, the token from the same .env value (KubeRay sets the variables)
    assert compose_ray.pop("RAY_AUTH_MODE") == cluster["spec"]["authOptions"]["mode"] == "token"
    compose_ray.pop("RAY_AUTH_TOKEN")
    assert cluster["spec"]["authOptions"]["secretName"]
    for name, container in _containers(cluster).items():
        env = resolved_env(container)
        for key, value in compose_ray.items():
            assert env.get(key) == value, f"{name}: {key}={env.get(key)!r}, compose has {value!r}"
    deployments = {d["metadata"]["name"]: d for d in of_kind("Deployment")}
    for service in ("mlflow", "postgres"):
        env = resolved_env(_containers(deployments[service])[service])
        for key, value in _interpolate(COMPOSE[service]["environment"]).items():
            assert env.get(key) == value, f"{service}: {key}={env.get(key)!r}, compose has {value!r}"


def test_the_services_have_compose_names_and_ports():
    services = {s["metadata"]["name"]: s for s in of_kind("Service")}
    for name, port in (("postgres", 5432), ("mlflow", 5000)):
        assert [p["port"] for p in services[name]["spec"]["ports"]] == [port], name
        selector = services[name]["spec"]["selector"]
        (deployment,) = [d for d in of_kind("Deployment") if d["metadata"]["name"] == name]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items(), name
    claims = {c["metadata"]["name"]: c for c in of_kind("PersistentVolumeClaim")}
    (cluster,) = of_kind("RayCluster")
    for group in (cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]):
        spec = group["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for c in spec["containers"] for m in c["volumeMounts"]}
        claim = volumes[mounts["/shared/runs"]]["persistentVolumeClaim"]["claimName"]  # compose's ray-storage path
        assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"]
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    kustomized = yaml.safe_load((KUBERAY / "kustomization.yaml").read_text())["resources"]
    assert sorted(kustomized) == sorted(p.name for p in KUBERAY.glob("*.yaml")
                                        if p.name not in ("kustomization.yaml", "rayjob.yaml"))


def test_the_rayjob_runs_a_sweep_on_the_raycluster():
    (cluster,) = of_kind("RayCluster")
    (job,) = of_kind("RayJob")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert job["spec"]["shutdownAfterJobFinishes"] is False  # a selected cluster is not the job's to delete
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["nalu-sweep", "sweep"]
    space = argv[2]
    assert space.startswith("/opt/nalu-sweep/search_spaces/")  # where the Dockerfile copies them
    assert (ROOT / "search_spaces" / Path(space).name).is_file()
    assert argv[argv.index("--address") + 1] == "auto"  # the head it runs on
    assert argv[argv.index("--storage-path") + 1] == "/shared/runs"
    from service.cli import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["sweep", "--help"])
    for flag in (a for a in argv[3:] if a.startswith("--")):
        assert flag in result.output, f"nalu-sweep sweep has no {flag}"
