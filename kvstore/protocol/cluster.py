"""A cluster as one document: what each node reports of itself in its heartbeat, how every
node sees the others, and the node's own view of Redis. ``GET /v1/cluster`` answers with
:class:`ClusterStatus`; ``kvstore cluster status`` reads it.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from kvstore.protocol.stats import Count

PEER_OWNER = "kvstore-peer"  # the owner id a node's reads from its peers say hello with


class NodeState(StrEnum):
    """``up``: heard from within ``suspect_after_s``; ``suspect``: silent longer, but within
    ``gone_after_s``; ``gone``: silent longer still (crashed, stopped or cut off). Peers fetch
    only from nodes that are up."""

    UP = "up"
    SUSPECT = "suspect"
    GONE = "gone"


class TierReport(BaseModel):
    """One tier of a node, as its heartbeat tells the others."""

    name: str
    capacity_bytes: Count
    used_bytes: Count
    blocks: Count


class NodeReport(BaseModel):
    """What a node publishes of itself with each heartbeat."""

    node_id: str
    address: str = Field(description="HOST:PORT of its data plane, which peers dial")
    rest_url: str = Field(default="", description="its REST base URL, where peers' clients start")
    version: str
    started_at: float = Field(description="Unix time the node joined")
    blocks: Count = 0
    tiers: list[TierReport] = Field(default_factory=list)
    peer_read_bytes_per_s: float | None = Field(
        default=None, description="how fast it read blocks from its peers so far (none: not yet)")


class NodeView(NodeReport):
    """A node as seen now: its report, the number it holds in the index, and its state."""

    slot: int = Field(ge=1, description="the node's number in the block index")
    state: NodeState
    silent_s: float = Field(ge=0, description="seconds since its last heartbeat")


class RedisView(BaseModel):
    """The node's link to Redis: ``degraded`` while Redis does not answer (the node keeps
    serving what it holds; its index updates wait, and are sent again in full once Redis is
    back)."""

    url: str = Field(description="the Redis URL with any password masked")
    connected: bool
    degraded: bool
    error: str | None = None
    cluster_mode: bool = Field(default=False, description="true when Redis is a Redis Cluster")


class IndexView(BaseModel):
    """The node's share of the block index: what is waiting to be published and what was."""

    pending: Count = Field(description="block placements not yet published")
    published: Count = Field(description="block placements published since the start")
    batches: Count = 0
    resyncs: Count = Field(default=0, description="full republications (at start, after "
                           "Redis was away)")
    dropped: Count = Field(default=0, description="pending placements dropped while Redis was "
                           "away (a full republication follows)")
    swept: Count = Field(default=0, description="index records of forgotten nodes this node "
                         "removed")


class PeerCounts(BaseModel):
    """Blocks this node read from its peers and kept (on a local miss)."""

    blocks: Count = 0
    bytes: Count = 0
    seconds: float = Field(default=0.0, ge=0, description="spent reading them")


class ClusterStatus(BaseModel):
    """``GET /v1/cluster``: this node, its link to Redis and every node it knows of."""

    node_id: str
    slot: int | None = Field(default=None, description="this node's number (None until it joined)")
    redis: RedisView
    index: IndexView
    fetched: PeerCounts = Field(default_factory=PeerCounts)
    heartbeat_s: float
    suspect_after_s: float
    gone_after_s: float
    nodes: list[NodeView] = Field(default_factory=list)
