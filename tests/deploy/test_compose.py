"""``deploy/compose.yaml``: valid for Compose (checked by Debian's ``docker-compose config``,
which needs no container engine), and it runs what it says: kvstore on a named volume at the
image's data dir with a health check, a vLLM CPU engine with the connector pointed at it, and
the router in front of a built-in engine worker, each from a target of ``deploy/Dockerfile``
and with commands their programs accept."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import CONNECTOR, DATA_DIR, DEPLOY, ROOT, flag, parse

COMPOSE = DEPLOY / "compose.yaml"


def compose_config(**env: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("Debian's docker-compose is not installed: make test installs it")
    clean = {k: v for k, v in os.environ.items() if k != "KVSTORE_TOKEN"}
    return subprocess.run([exe, "-f", str(COMPOSE), "config"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**clean, **env})


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    """The services as Compose resolves them (anchors merged, variables set)."""
    done = compose_config(KVSTORE_TOKEN="t0ken")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = yaml.safe_load(done.stdout)["services"]
    return found


def test_compose_refuses_to_start_without_a_token() -> None:
    done = compose_config()
    assert done.returncode != 0 and "export KVSTORE_TOKEN first" in done.stderr, done.stderr


def test_the_services(services: dict[str, Any]) -> None:
    assert set(services) == {"kvstore", "model", "vllm", "worker", "router"}
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", (DEPLOY / "Dockerfile").read_text(), re.M))
    for name, svc in services.items():
        assert svc["build"]["target"] in targets, name
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile", name


def test_kvstore_keeps_its_data_in_a_named_volume_with_a_health_check(
        services: dict[str, Any]) -> None:
    svc = services["kvstore"]
    assert svc["build"]["target"] == "kvstore"
    (volume,) = svc["volumes"]
    name, where, _ = volume.split(":")
    assert where == DATA_DIR
    assert name in yaml.safe_load(COMPOSE.read_text())["volumes"]
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and "kvstore health" in test[1]
    assert svc["environment"]["KVSTORE_TOKEN"] == "t0ken"
    for service in ("vllm", "worker", "router"):
        assert services[service]["depends_on"]["kvstore"] == {"condition": "service_healthy"}


def test_vllm_uses_the_connector_on_the_kvstore_service(services: dict[str, Any]) -> None:
    svc = services["vllm"]
    argv = svc["command"]
    transfer = json.loads(flag(argv, "--kv-transfer-config"))
    assert CONNECTOR.items() <= transfer.items()
    assert transfer["kv_connector_extra_config"]["kvstore_url"] == "http://kvstore:8470"
    assert svc["environment"]["KVSTORE_TOKEN"] == "t0ken"  # the connector reads it
    # what vLLM's CPU engine needs on a small machine (its own parser: test_vllm_args.py)
    assert {"--enforce-eager", "--kv-cache-memory-bytes"} <= set(argv)
    assert int(flag(argv, "--block-size")) % 32 == 0


def test_router_and_worker_commands(services: dict[str, Any]) -> None:
    worker = parse("kvstore-engine", services["worker"]["command"])
    assert worker.kvstore == "http://kvstore:8470" and worker.kvstore_token_file
    router = parse("kvstore-router", services["router"]["command"])
    assert router.workers == ["http://worker:8481"] and router.kvstore_token_file
    model = services["model"]["command"][-1]
    assert "kvstore-engine make-model /models/tiny-llama" in model
    parse("kvstore-engine", model.split("|| ", 1)[1].split())
