"""What a node holds while Redis answers: the client, and the calls it makes over it
(membership, the block index, namespace claims, the sweep of forgotten nodes' records)."""

from __future__ import annotations

import logging

from kvstore.cluster.claims import Claims
from kvstore.cluster.config import ClusterConfig
from kvstore.cluster.index import ClusterIndex
from kvstore.cluster.link import RedisClient
from kvstore.cluster.members import Membership
from kvstore.cluster.sweep import Sweeper

log = logging.getLogger("kvstore.cluster")


class RedisSession:
    """What the node holds while Redis answers: the client and the calls over it (the index
    once the node joined: its bits are the cluster's)."""

    def __init__(self, client: RedisClient, clustered: bool, config: ClusterConfig) -> None:
        self.client = client
        self.clustered = clustered
        self.members = Membership(client, config)
        self.index = ClusterIndex(client, config.index_bits)
        self.claims = Claims(client, config.node_id)
        self.sweeper = Sweeper(client, config.node_id, config.heartbeat_s)

    def join(self, config: ClusterConfig) -> int:
        slot, bits = self.members.join()
        if bits != self.index.bits:
            if bits != config.index_bits:
                log.warning("index_bits is %d in this cluster, not %d as set here; "
                            "using %d", bits, config.index_bits, bits)
            self.index = ClusterIndex(self.client, bits)
        return slot
