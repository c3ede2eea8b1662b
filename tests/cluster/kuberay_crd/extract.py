"""Regenerate the schemas here from a KubeRay checkout:

    python tests/cluster/kuberay_crd/extract.py /path/to/kuberay

Takes the ``v1`` version's ``openAPIV3Schema`` of the RayCluster and RayJob CRDs
(``ray-operator/config/crd/bases/``), drops the ``description`` texts (documentation only,
three quarters of the size), and in the RayJob schema replaces ``spec.rayClusterSpec``,
identical to the RayCluster schema's ``spec`` (checked here), by a ``$ref`` to it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CLUSTER_SPEC_REF = {"$ref": "raycluster.v1.json#/properties/spec"}


def v1_schema(path: Path) -> dict:
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def without_descriptions(node):
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def main(kuberay: Path) -> None:
    bases = kuberay / "ray-operator" / "config" / "crd" / "bases"
    cluster = without_descriptions(v1_schema(bases / "ray.io_rayclusters.yaml"))
    job = without_descriptions(v1_schema(bases / "ray.io_rayjobs.yaml"))
    spec = job["properties"]["spec"]["properties"]
    assert spec["rayClusterSpec"] == cluster["properties"]["spec"], "rayClusterSpec differs from RayCluster.spec"
    spec["rayClusterSpec"] = CLUSTER_SPEC_REF
    for name, schema in (("raycluster.v1.json", cluster), ("rayjob.v1.json", job)):
        (HERE / name).write_text(json.dumps(schema, separators=(",", ":"), sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
