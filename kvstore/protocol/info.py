"""What a server says about itself: the ``GET /v1/info`` document, which the data plane's
``hello`` reply carries too. One type for the server that builds it and the clients that read
it (:mod:`kvstore.client.discovery` turns it into the route a client takes)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from kvstore.protocol.stats import Count


class ShmInfo(BaseModel):
    """The host slab a local client may map."""

    # None: an anonymous memfd, mapped only through the data plane's ``shm_map`` (Unix socket)
    name: str | None = None
    size: Count
    slot_bytes: Count
    gen_offset: Count | None = None  # the slots' generation words (uint64) start here


class ServerInfo(BaseModel):
    """What a client needs to reach the data plane."""

    version: str
    protocol: int
    instance: str = Field(description="changes at every server start")
    host_id: str = Field(description="same value for every process on this host")
    data_port: int | None
    unix_socket: str | None
    shm: ShmInfo | None
    auth_required: bool
    max_frame_bytes: int
    max_header_bytes: int
    max_batch: int
    max_lease_s: float | None = Field(
        default=None, description="longest lease this server grants: leases asked for longer "
                                  "are cut to it")
    node_id: str | None = Field(default=None, description="this node's id in its cluster "
                                "(none: a node alone); a router maps workers to nodes by it")
    rest_port: int | None = Field(default=None, description="the port the REST control plane "
                                  "listens on (a proxy in front may publish another)")
    data_dir: str | None = Field(default=None, description="the server's data dir (absolute); "
                                 "in the admin's answer only")
