"""How a client finds the data plane: ``GET /v1/info`` on the REST URL, then the Unix socket
and shared memory when the server runs on this host, else TCP to the URL's host."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from pydantic import ValidationError

from kvstore.client.errors import AuthenticationError, KVStoreUnavailableError, ProtocolError
from kvstore.problems import problems
from kvstore.protocol.info import ServerInfo


def host_id() -> str:
    """Equal for every process on this machine (and boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}/{boot}"


@dataclass(frozen=True, slots=True)
class Route:
    """How this client reaches one server instance (from its
    :class:`~kvstore.protocol.info.ServerInfo`): over which socket, whether the slab is local,
    and the limits its frames keep to."""

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
    protocol: int = 1  # the data plane protocol version the server speaks


def info_url(url: str) -> str:
    return url.rstrip("/") + "/v1/info"


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_response(status: int, text: str, url: str) -> None:
    if status in (401, 403):
        raise AuthenticationError(f"{url}: {status} {text}", "unauthenticated")
    if status != 200:
        raise KVStoreUnavailableError(f"{url}: {status} {text}")


def parse_info(url: str, doc: Any, transport: str = "auto") -> Route:
    """The data plane target: the Unix socket if it is on this host and reachable, else
    TCP to the REST URL's host. ``transport="tcp"`` forces TCP (and no shared memory),
    ``"unix"`` requires the socket. ``doc`` is the ``/v1/info`` answer
    (:class:`~kvstore.protocol.info.ServerInfo`)."""
    if transport not in ("auto", "tcp", "unix"):
        raise ValueError(f"transport must be auto, tcp or unix, got {transport!r}")
    try:
        info = ServerInfo.model_validate(doc)
    except ValidationError as exc:
        first = problems(exc)[0]
        raise ProtocolError(f"{url}: unexpected /v1/info answer: "
                            f"{first.where() or 'the document'}: {first.msg}") from None
    local = info.host_id == host_id() and transport != "tcp"
    path, shm = info.unix_socket, info.shm
    target: tuple[str, int] | str
    if local and path and os.path.exists(path):
        target = path
    elif transport == "unix":
        raise KVStoreUnavailableError(f"{url}: its Unix socket is not reachable from here")
    elif info.data_port:
        target = (urlparse(url).hostname or "127.0.0.1", info.data_port)
    else:
        raise KVStoreUnavailableError(f"{url}: the server offers no reachable data plane")
    return Route(
        instance=info.instance, local=local, target=target,
        shm_name=shm.name if shm is not None and local else None,
        shm_size=shm.size if shm is not None else 0,
        max_frame_bytes=info.max_frame_bytes, max_batch=info.max_batch,
        shm_slot_bytes=shm.slot_bytes if shm is not None else 0,
        shm_gen_offset=shm.gen_offset if shm is not None else None,
        shm_offered=shm is not None and local, max_lease_s=info.max_lease_s,
        protocol=info.protocol,
    )
