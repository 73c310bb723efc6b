"""Start and stop one server process: store, REST (uvicorn) and data plane on one event loop.

Start: check that this machine can honour the settings (memory for the host tier, the device
tier's device), lock the data dir (two servers on one folder would corrupt each other's view),
bind the REST and data ports, claim the Unix socket path (only a stale socket is removed),
reclaim the shared-memory segment a crashed predecessor left (never one a live server holds),
open the store (its index is rebuilt from LMDB), then listen; every refusal comes before the
store opens and before the server says it is serving (:mod:`server.preflight`).

Stop (SIGTERM or SIGINT): ``/healthz`` turns 503, listeners stop accepting, in-flight requests
finish (up to ``shutdown_grace_s``), then the store closes: memory-only blocks spill to disk
and LMDB is synced, so nothing half-written remains.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import uvicorn

from kvstore import __version__
from kvstore.client.discovery import host_id
from kvstore.cluster.urls import masked
from kvstore.protocol.frame import PROTOCOL_VERSION
from kvstore.protocol.info import ServerInfo, ShmInfo
from kvstore.store import StoreAPI
from server import banner
from server.auth import Authenticator
from server.dataplane.server import DataPlane
from server.logs import announce
from server.metrics import ServerMetrics
from server.preflight import (
    StartupError,
    bind_tcp,
    check_data_dir,
    check_device,
    check_extras,
    check_memory,
    claim_socket_path,
)
from server.rest.app import create_app
from server.rest.conn_guard import guarded_http
from server.settings import ServerSettings
from server.whatif_metrics import store_curves

if TYPE_CHECKING:
    from server.peer_fill import PeerFill

log = logging.getLogger("kvstore.server")


@contextlib.contextmanager
def data_dir_lock(settings: ServerSettings) -> Iterator[None]:
    """Hold an exclusive lock on the data dir for the server's life; fail fast if taken."""
    path = settings.data_path
    check_data_dir(path)
    os.chmod(path, 0o700)  # cached KV and layouts are the server user's alone, whatever the umask
    fd = os.open(path / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartupError(f"data dir {path} is in use by another kvstore server (it holds "
                               "server.lock); stop that server or choose another --data-dir") \
                from None
        yield
    finally:
        os.close(fd)


def open_store(settings: ServerSettings) -> StoreAPI:
    from kvstore.store import Store

    return Store(settings.store_config())


def build_info(settings: ServerSettings, store: StoreAPI) -> ServerInfo:
    slab = store.host_slab() if settings.enable_shm else None
    share = store.host_share() if slab is not None else None
    shm = ShmInfo(name=slab.shm_name, size=slab.size, slot_bytes=slab.slot_bytes,
                  gen_offset=share.gen_offset if share is not None else None) \
        if slab is not None and (slab.shm_name or share is not None) else None
    return ServerInfo(
        version=__version__, protocol=PROTOCOL_VERSION, instance=uuid.uuid4().hex,
        host_id=host_id(), data_port=settings.data_port or None,
        unix_socket=settings.socket_path, shm=shm, auth_required=settings.auth_enabled(),
        max_frame_bytes=settings.max_frame_bytes, max_header_bytes=settings.max_header_bytes,
        max_batch=settings.max_batch, max_lease_s=settings.max_lease_s,
        node_id=cluster.node_id if (cluster := settings.cluster_config()) else None,
        rest_port=settings.port, data_dir=str(settings.data_path),
    )


def durable_tier(settings: ServerSettings) -> str | None:
    if settings.disk_capacity:
        return "disk"
    return "s3" if settings.s3_bucket else None


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``kvstore serve`` runs on: uvloop for ``auto`` where it is installed
    (it is a dependency on Linux and macOS), else asyncio's own. None means asyncio's."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise StartupError("event_loop uvloop is set but uvloop is not installed; set "
                               "--event-loop auto or asyncio") from None
        return None
    return uvloop.new_event_loop


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: we stop it, then close the store."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: ServerSettings) -> int:
    """Run until SIGTERM or SIGINT. Everything that can refuse the start (a setting this
    machine cannot honour, a taken port, data dir or socket) is checked before the store is
    opened and before the server says it is serving: :class:`StartupError`."""
    check_memory(settings)
    check_extras(settings)
    check_device(settings)
    with data_dir_lock(settings), contextlib.ExitStack() as bound:
        rest = bind_tcp(settings.host, settings.port, "--port")
        data = bind_tcp(settings.host, settings.data_port, "--data-port") \
            if settings.data_port else []
        for sock in rest + data:  # the listeners take them over; closing twice is harmless
            bound.callback(sock.close)
        if settings.socket_path:
            claim_socket_path(settings.socket_path)  # before anything is opened
        store = open_store(settings)
        try:
            return await _serve_store(settings, store, rest, data)
        finally:
            try:
                held = store.stats()
            except Exception:  # a broken tier: the close still runs, the line says less
                held = None
            lost = store.close()
            text, fields = banner.stopped(lost, store.spilled, held)
            announce(text, settings.log_format, **fields)


def start_cluster(settings: ServerSettings, store: StoreAPI) -> PeerFill | None:
    """The node's part in its cluster, started (None without ``--cluster``): membership, index
    publication and reads from peers. It connects in the background: a Redis that does not
    answer yet leaves the node serving, degraded."""
    config = settings.cluster_config()
    if config is None:
        return None
    # here, not at the top: a node alone never loads redis-py
    from kvstore.cluster.node import ClusterNode
    from kvstore.cluster.peers import Peers
    from server.peer_fill import PeerFill

    node = ClusterNode(config, store, __version__)
    node.start()
    token = settings.cluster_token.get_secret_value() if settings.cluster_token else None
    return PeerFill(node, store, Peers(token))


async def _serve_store(settings: ServerSettings, store: StoreAPI, rest: list[socket.socket],
                       data: list[socket.socket]) -> int:
    fill = start_cluster(settings, store)
    try:
        return await _serve_node(settings, store, rest, data, fill)
    finally:
        if fill is not None:
            await asyncio.to_thread(fill.close)


async def _serve_node(settings: ServerSettings, store: StoreAPI, rest: list[socket.socket],
                      data: list[socket.socket], fill: PeerFill | None) -> int:
    node = fill.node if fill is not None else None
    info = build_info(settings, store)
    metrics = ServerMetrics(store.stats, store.health, store_curves(store))
    if node is not None:
        from server.cluster_metrics import ClusterCollector

        metrics.registry.register(ClusterCollector(node))
    tier = durable_tier(settings)
    app = create_app(store, settings, info, metrics, tier, node, fill)
    plane = DataPlane(store, settings, info, Authenticator(settings), metrics, tier, fill)
    await plane.start(data)
    rest_conns: set[object] = set()
    metrics.watch_connections("rest", rest_conns.__len__)
    server = _Uvicorn(uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level,
        log_config=None, access_log=settings.access_log, lifespan="off",
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        timeout_keep_alive=30,  # requests in flight: server.rest.gate; half-open: conn_guard
        http=guarded_http(settings.rest_header_timeout_s, settings.rest_max_pending_connections,
                          live=rest_conns),
    ))
    loop = asyncio.get_running_loop()

    def stop(signum: int) -> None:
        log.info("signal %d: shutting down", signum)
        app.state.closing = True
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    cluster = f"{node.config.node_id} via {masked(node.config.url)}" if node else None
    text, fields = banner.start(settings, info, store.stats(), cluster)
    announce(text, settings.log_format, **fields)
    try:
        await server.serve(sockets=rest)
    finally:
        app.state.closing = True
        await plane.close(settings.shutdown_grace_s)
    return 0 if server.started else 1
