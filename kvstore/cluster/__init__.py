"""kvstore nodes as one cache: membership and a block index kept in Redis.

Each node heartbeats into Redis (:mod:`~kvstore.cluster.members`) and publishes which blocks
its own tiers hold (:mod:`~kvstore.cluster.index`, fed by :mod:`~kvstore.cluster.publisher`
from the store's placement changes); :class:`~kvstore.cluster.node.ClusterNode` runs both for
one server. Redis is the only shared state: a node that loses it keeps serving what it holds.
The design and its consistency rules are in ``docs/cluster.md``.
"""
