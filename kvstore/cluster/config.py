"""How a node takes part in a cluster: where Redis is, who the node is, and its timings."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HEARTBEAT_S = 1.0  # seconds between a node's heartbeats
DEFAULT_SUSPECT_AFTER_S = 3.0  # seconds of silence before a node is suspect (3 missed beats)
DEFAULT_GONE_AFTER_S = 10.0  # seconds of silence before a node is gone
DEFAULT_FORGET_AFTER_S = 3600.0  # seconds a gone node stays listed before it is pruned
DEFAULT_PUBLISH_S = 0.1  # seconds between index batches: the index's staleness bound
DEFAULT_INDEX_BITS = 16  # index buckets per namespace = 2**bits (Redis small hashes)
SUSPECT_BEATS, GONE_BEATS = 3, 10  # silent beats before a node is suspect, gone
DEFAULT_MAX_PENDING = 1 << 16  # placements kept while Redis is away (~200 B each), then
# a full republication


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """One node's part in a cluster. ``url`` is a ``redis://`` or ``rediss://`` URL (a
    password in it is never shown); ``address`` is the data-plane ``HOST:PORT`` peers dial
    and ``rest_url`` the REST base URL their clients start from;
    ``node_id`` names the node across restarts (its address unless set)."""

    url: str
    node_id: str
    address: str
    rest_url: str = ""
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    suspect_after_s: float = DEFAULT_SUSPECT_AFTER_S
    gone_after_s: float = DEFAULT_GONE_AFTER_S
    forget_after_s: float = DEFAULT_FORGET_AFTER_S
    publish_s: float = DEFAULT_PUBLISH_S
    index_bits: int = DEFAULT_INDEX_BITS
    max_pending: int = DEFAULT_MAX_PENDING

    @classmethod
    def beating(cls, url: str, node_id: str, address: str, heartbeat_s: float, *,
                rest_url: str = "", index_bits: int = DEFAULT_INDEX_BITS) -> ClusterConfig:
        """Timings that follow the heartbeat: a node silent for :data:`SUSPECT_BEATS` beats
        is suspect, for :data:`GONE_BEATS` gone, forgotten after an hour (or 100 beats); the
        index is published every tenth of a second (or every beat, if shorter)."""
        return cls(url=url, node_id=node_id, address=address, heartbeat_s=heartbeat_s,
                   suspect_after_s=SUSPECT_BEATS * heartbeat_s,
                   gone_after_s=GONE_BEATS * heartbeat_s,
                   forget_after_s=max(DEFAULT_FORGET_AFTER_S, 100 * heartbeat_s),
                   publish_s=min(DEFAULT_PUBLISH_S, heartbeat_s), rest_url=rest_url,
                   index_bits=index_bits)

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s < self.suspect_after_s < self.gone_after_s \
                <= self.forget_after_s:
            raise ValueError("cluster timings must satisfy 0 < heartbeat_s < suspect_after_s "
                             "< gone_after_s <= forget_after_s")
        if not 0 < self.publish_s <= 60:
            raise ValueError("cluster publish_s must be in (0, 60] seconds")
        if not 0 <= self.index_bits <= 24:
            raise ValueError("cluster index_bits must be in [0, 24]")
