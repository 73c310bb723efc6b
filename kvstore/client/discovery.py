"""How a client finds the data plane: ``GET /v1/info`` on the REST URL, then the Unix socket
and shared memory when the server runs on this host, else TCP to the URL's host."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from kvstore.client.errors import AuthenticationError, KVStoreUnavailableError, ProtocolError


def host_id() -> str:
    """Equal for every process on this machine (and boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}/{boot}"


@dataclass(frozen=True, slots=True)
class ServerInfo:
    instance: str
    local: bool
    target: tuple[str, int] | str  # (host, port) or a Unix socket path
    shm_name: str | None
    shm_size: int
    max_frame_bytes: int
    max_batch: int
    shm_slot_bytes: int = 0
    shm_gen_offset: int | None = None  # where the slots' generations start in the segment
    shm_offered: bool = False  # a slab to map (by name, or a memfd over the Unix socket)
    max_lease_s: float | None = None  # the server cuts longer leases to this (None: unknown)


def info_url(url: str) -> str:
    return url.rstrip("/") + "/v1/info"


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_response(status: int, text: str, url: str) -> None:
    if status in (401, 403):
        raise AuthenticationError(f"{url}: {status} {text}", "unauthenticated")
    if status != 200:
        raise KVStoreUnavailableError(f"{url}: {status} {text}")


def parse_info(url: str, doc: dict[str, Any], transport: str = "auto") -> ServerInfo:
    """The data plane target: the Unix socket if it is on this host and reachable, else
    TCP to the REST URL's host. ``transport="tcp"`` forces TCP (and no shared memory),
    ``"unix"`` requires the socket."""
    if transport not in ("auto", "tcp", "unix"):
        raise ValueError(f"transport must be auto, tcp or unix, got {transport!r}")
    try:
        local = doc["host_id"] == host_id()
        path = doc.get("unix_socket")
        shm = doc.get("shm") or {}
        target: tuple[str, int] | str
        if transport == "tcp":
            local = False
        if local and path and os.path.exists(path):
            target = path
        elif transport == "unix":
            raise KVStoreUnavailableError(f"{url}: its Unix socket is not reachable from here")
        elif doc.get("data_port"):
            target = (urlparse(url).hostname or "127.0.0.1", int(doc["data_port"]))
        else:
            raise KVStoreUnavailableError(f"{url}: the server offers no reachable data plane")
        return ServerInfo(
            instance=str(doc["instance"]), local=local, target=target,
            shm_name=shm.get("name") if local else None, shm_size=int(shm.get("size", 0)),
            max_frame_bytes=int(doc["max_frame_bytes"]), max_batch=int(doc["max_batch"]),
            shm_slot_bytes=int(shm.get("slot_bytes") or 0),
            shm_gen_offset=None if shm.get("gen_offset") is None else int(shm["gen_offset"]),
            shm_offered=bool(shm) and local,
            max_lease_s=None if doc.get("max_lease_s") is None else float(doc["max_lease_s"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"{url}: unexpected /v1/info answer: {exc}") from None
