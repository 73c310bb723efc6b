"""``deploy/k8s/``: every manifest valid against the Kubernetes API schemas (strict: a
misspelled field fails), and the parts fit together: the StatefulSet's volume, probes, Secret
and ConfigMap are the ones kvstore reads, its settings load, and the vLLM example reaches the
Service with the connector and the token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server.settings import ServerSettings, load_settings
from tests.deploy.manifests import CONNECTOR, DEPLOY, documents, flag, parse

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra (make test)")

K8S = DEPLOY / "k8s"
# the oldest Kubernetes release still in its makers' support window when this was written,
# and the newest the package ships schemas of
VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())


def manifests() -> dict[str, dict[str, Any]]:
    """``Kind/name`` -> the manifest, over every file."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in documents(path):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def pod(kind_name: str) -> dict[str, Any]:
    spec: dict[str, Any] = manifests()[kind_name]["spec"]["template"]["spec"]
    return spec


def mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in container["volumeMounts"]}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", sorted(K8S.glob("*.yaml")), ids=lambda p: p.name)
def test_manifest_is_valid(path: Path, version: str) -> None:
    for doc in documents(path):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_files_hold_the_parts_asked_for() -> None:
    assert set(manifests()) == {
        "ConfigMap/kvstore-config", "Service/kvstore", "Service/kvstore-headless",
        "StatefulSet/kvstore", "Deployment/vllm", "Service/vllm"}


def test_statefulset_keeps_lmdb_on_a_claim_and_reads_config_and_token(tmp_path: Path) -> None:
    sts = manifests()["StatefulSet/kvstore"]
    spec = pod("StatefulSet/kvstore")
    (box,) = spec["containers"]
    args = parse("kvstore", box["args"])
    assert args.command == "serve"
    by_name = {v["name"]: v for v in spec["volumes"]}
    where = mounts(box)

    # config: the ConfigMap's key, at the path --config names
    config_path = Path(flag(box["args"], "--config"))
    config = by_name["config"]["configMap"]["name"]
    assert where["config"] == str(config_path.parent)
    text = manifests()[f"ConfigMap/{config}"]["data"][config_path.name]
    # token: the Secret's key, at the path --token-file names
    token_path = Path(flag(box["args"], "--token-file"))
    assert where["token"] == str(token_path.parent)
    assert by_name["token"]["secret"]["secretName"] == "kvstore-token"
    # the data dir the config names is the claim's mount, not a pod volume
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] not in by_name
    settings = settings_of(text, tmp_path)
    assert where[claim["metadata"]["name"]] == settings.data_dir
    assert sts["spec"]["serviceName"] == "kvstore-headless"

    # the pod's memory limit holds the host tier's slab, reserved in full at start
    limit = box["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and int(limit[:-2]) << 30 >= settings.host_capacity + (1 << 29)


def settings_of(text: str, tmp_path: Path) -> ServerSettings:
    """The ConfigMap's YAML as ``kvstore serve --config`` reads it (a bad key or value
    raises); off loopback it needs a token, given here as the Secret gives it."""
    path = tmp_path / "kvstore.yaml"
    path.write_text(text)
    return load_settings(path, token="from-the-secret")


def test_probes_ask_healthz_on_the_rest_port(tmp_path: Path) -> None:
    (box,) = pod("StatefulSet/kvstore")["containers"]
    ports = {p["name"]: p["containerPort"] for p in box["ports"]}
    config = manifests()["ConfigMap/kvstore-config"]["data"]["kvstore.yaml"]
    settings = settings_of(config, tmp_path)
    assert ports == {"rest": settings.port, "data": settings.data_port}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert box[probe]["httpGet"] == {"path": "/healthz", "port": "rest"}, probe


def test_services_reach_both_planes() -> None:
    for name in ("Service/kvstore", "Service/kvstore-headless"):
        svc = manifests()[name]["spec"]
        assert svc["selector"] == {"app.kubernetes.io/name": "kvstore"}
        assert {p["name"]: p["targetPort"] for p in svc["ports"]} == {"rest": "rest",
                                                                       "data": "data"}
    assert manifests()["Service/kvstore-headless"]["spec"]["clusterIP"] == "None"


def test_kvstore_runs_unprivileged() -> None:
    spec = pod("StatefulSet/kvstore")
    assert spec["securityContext"]["runAsNonRoot"] is True
    (box,) = spec["containers"]
    assert box["securityContext"]["allowPrivilegeEscalation"] is False
    assert box["securityContext"]["readOnlyRootFilesystem"] is True


def test_vllm_example_uses_the_connector_the_service_and_the_token() -> None:
    (box,) = pod("Deployment/vllm")["containers"]
    transfer = json.loads(flag(box["args"], "--kv-transfer-config"))
    assert CONNECTOR.items() <= transfer.items()
    svc = manifests()["Service/kvstore"]["spec"]
    rest = next(p["port"] for p in svc["ports"] if p["name"] == "rest")
    assert transfer["kv_connector_extra_config"]["kvstore_url"] == f"http://kvstore:{rest}"
    env = {e["name"]: e for e in box["env"]}
    assert env["KVSTORE_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "kvstore-token",
                                                                 "key": "token"}
    assert int(flag(box["args"], "--block-size")) % 32 == 0  # vLLM's CPU attention
