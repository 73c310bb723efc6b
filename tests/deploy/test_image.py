"""``deploy/Dockerfile``'s server image, built and run with Debian's rootful podman: the
runtime install only (no torch), a non-root user, the data dir a volume that keeps the blocks
across containers, the health check answered, and a start without a token refused in one line.

The base is ``make deploy-base``'s image (Debian's python3 from debootstrap: no container
registry is reached from the test machines) given as the ``BASE`` build argument; with
``python:3.11-slim-bookworm``, the default, the same steps run. Where podman cannot run
containers here (not root, no podman, no base image: make test provides all three, as root)
the test fails, saying why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore.client import KVStoreClient
from kvstore.testing.proc import free_port
from kvstore.types import BlockHash
from tests.deploy.manifests import DATA_DIR, DEPLOY, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BASE = "localhost/kvstore-deploy-base:bookworm"
IMAGE = "localhost/kvstore-deploy-test:latest"
TOKEN = "image-test-token"
KEY = BlockHash(b"\1" * 32)
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# The test machines: root without CAP_SYS_RESOURCE (podman's default ulimits cannot be set) and
# cgroups v1 and v2 mixed (crun refuses them; runc runs). Host networking: the test talks to
# the container on loopback only.
RUN_FLAGS = ["--runtime", "runc", "--ulimit", "nofile=20000:20000", "--ulimit",
             "nproc=4096:4096", "--network", "host"]


def podman(*args: str, timeout: float = 120, check: bool = True,
           ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:2])}: {done.returncode}\n"
                             f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("podman") is None:
        pytest.fail("no podman here (Debian's package): make test installs it")
    if os.geteuid() != 0:
        pytest.fail("rootful podman needs root: make test runs as root, as CI does")
    if podman("image", "exists", BASE, check=False).returncode != 0:
        pytest.fail(f"no base image {BASE}: make deploy-base makes it (make test does)")
    build = ["build", *RUN_FLAGS, "--format", "docker", "--build-arg", f"BASE={BASE}",
             "-f", str(DEPLOY / "Dockerfile"), "-t", IMAGE]
    if HOST_CA.exists():  # pip in the build trusts what this machine trusts (a proxy's CA)
        conf = tmp_path_factory.mktemp("pip") / "pip.conf"
        conf.write_text(f"[global]\ncert = {HOST_CA}\n")
        build += ["-v", f"{HOST_CA}:{HOST_CA}:ro", "-v", f"{conf}:/etc/pip.conf:ro"]
    podman(*build, str(ROOT), timeout=480)
    return IMAGE


class Container:
    """``kvstore serve`` in a container on free loopback ports, data in ``volume``."""

    def __init__(self, volume: str) -> None:
        self.port, self.data_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.id = podman("run", "-d", *RUN_FLAGS, "-v", f"{volume}:{DATA_DIR}",
                         "-e", f"KVSTORE_TOKEN={TOKEN}", "-e", f"KVSTORE_PORT={self.port}",
                         "-e", f"KVSTORE_DATA_PORT={self.data_port}",
                         "-e", "KVSTORE_HOST_CAPACITY=64MiB",
                         "-e", "KVSTORE_DISK_CAPACITY=256MiB", IMAGE).stdout.strip()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        raise AssertionError(f"no /healthz in 90 s:\n{self.logs()}")

    def logs(self) -> str:
        done = podman("logs", self.id, check=False)
        return done.stdout + done.stderr

    def stop(self) -> str:
        """SIGTERM, as ``docker stop`` sends it; the exit code and the logs."""
        podman("stop", "-t", "60", self.id, timeout=90)
        code = podman("inspect", self.id, "--format", "{{.State.ExitCode}}").stdout.strip()
        logs = self.logs()
        podman("rm", self.id, check=False)
        return f"{code}\n{logs}"


@pytest.fixture
def volume(image: str) -> Iterator[str]:
    name = f"kvstore-deploy-test-{os.getpid()}"
    podman("volume", "create", name)
    yield name
    podman("volume", "rm", "-f", name, check=False)


def test_image_is_the_runtime_as_a_user_with_a_data_volume(image: str) -> None:
    found: dict[str, Any] = json.loads(podman("image", "inspect", image).stdout)[0]
    cfg = found["Config"]
    assert cfg["User"] == "kvstore"
    assert DATA_DIR in cfg["Volumes"]
    assert "kvstore health" in found["Healthcheck"]["Test"][1]
    assert cfg["Entrypoint"] == ["kvstore"] and cfg["Cmd"] == ["serve"]
    listed = podman("run", "--rm", *RUN_FLAGS, "--entrypoint", "pip", image, "list",
                    "--format", "json").stdout
    installed = {p["name"].lower() for p in json.loads(listed)}
    assert "kvstore" in installed and "fastapi" in installed
    assert not installed & {"torch", "transformers", "boto3", "pytest"}, installed


def test_serves_answers_its_health_check_and_keeps_blocks_in_the_volume(volume: str) -> None:
    box = Container(volume)
    try:
        assert podman("healthcheck", "run", box.id, check=False).returncode == 0, box.logs()
        client = KVStoreClient(box.url, TOKEN)
        try:
            client.register_namespace("ns", 4096, {"model_id": "m", "block_size": 16})
            assert client.put("ns", [KEY], [b"\7" * 4096]).stored == 1
        finally:
            client.close()
    finally:
        stopped = box.stop()
    assert stopped.startswith("0\n"), stopped  # a clean stop: the host tier went to disk

    again = Container(volume)  # a new container on the same volume
    try:
        client = KVStoreClient(again.url, TOKEN)
        try:
            assert client.get("ns", [KEY]) == [b"\7" * 4096]
        finally:
            client.close()
    finally:
        again.stop()


def test_a_start_without_a_token_is_refused_in_one_line(image: str) -> None:
    done = podman("run", "--rm", *RUN_FLAGS, "-e", f"KVSTORE_PORT={free_port()}", "-e",
                  f"KVSTORE_DATA_PORT={free_port()}", image, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    # podman's own lines (time="..." level=...) say it cannot reach systemd for health timers
    lines = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("time=")]
    assert len(lines) == 1 and "token" in lines[0], done.stderr
