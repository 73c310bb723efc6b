"""The cluster part that the server's settings describe: the Redis URL, the node's name and
the data-plane address peers dial, as a :class:`~kvstore.cluster.config.ClusterConfig` (or
None for a node alone). The other timings follow the heartbeat
(:meth:`~kvstore.cluster.config.ClusterConfig.beating`)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from kvstore.cluster.config import ClusterConfig
from kvstore.cluster.urls import check_url

if TYPE_CHECKING:
    from server.settings import ServerSettings


def advertised(s: ServerSettings) -> str:
    """``advertise``, else the bound host (this machine's name when bound to every address)
    and the data port."""
    if s.advertise:
        return s.advertise
    host = socket.getfqdn() if s.host in ("0.0.0.0", "::", "") else s.host
    return f"{host}:{s.data_port}"


def rest_url(s: ServerSettings, address: str) -> str:
    """The REST base URL peers reach: the advertised host and the REST port."""
    host = address.rpartition(":")[0]
    return f"http://{host}:{s.port}"


def check_cluster(s: ServerSettings) -> None:
    """ValueError naming the setting when the cluster settings cannot work together."""
    assert s.cluster is not None
    check_url(s.cluster.get_secret_value())
    if not s.data_port:
        raise ValueError("cluster needs the TCP data plane (peers fetch blocks over it): set "
                         "data_port")
    if s.auth_enabled() and s.cluster_token is None:
        raise ValueError("a node with tokens needs cluster_token too (set cluster_token_file): "
                         "the nodes present it to each other")
    host, sep, port = (s.advertise or "").rpartition(":")
    if s.advertise is not None and (not sep or not host or not port.isdigit()
                                    or not 0 < int(port) < 65536):
        raise ValueError(f"advertise {s.advertise!r} must be HOST:PORT")


def cluster_config_of(s: ServerSettings) -> ClusterConfig | None:
    if s.cluster is None:
        return None
    address = advertised(s)
    return ClusterConfig.beating(s.cluster.get_secret_value(), s.node_id or address, address,
                                 s.cluster_heartbeat_s, rest_url=rest_url(s, address),
                                 index_bits=s.cluster_index_bits)
