"""The cluster's block index in Redis: which node holds which block, in which tier.

A node only ever changes its own records (its slot's), one bucket per script call, all of a
batch in one pipeline (one round trip; on a Redis Cluster, one per shard). A
lookup is one pipelined ``HMGET`` per bucket touched. Records of nodes that are no longer up
are left in place and skipped by readers: a node coming back republishes, and a record that
proves stale (the peer answers a miss) is removed by :meth:`ClusterIndex.correct`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.cluster.keys import bucket_key, field, records, slot_bytes
from kvstore.cluster.link import RedisClient, pipelines

# KEYS: one bucket; ARGV: the node's slot (4 bytes), then field, tier code ('' to remove)...
# Rewrites each field's value with this node's record replaced, added or removed.
_SET = """
local me = ARGV[1]
for i = 2, #ARGV, 2 do
  local v = redis.call('HGET', KEYS[1], ARGV[i]) or ''
  local out = {}
  for j = 1, #v, 5 do
    local rec = string.sub(v, j, j + 4)
    if string.sub(rec, 1, 4) ~= me then out[#out + 1] = rec end
  end
  if ARGV[i + 1] ~= '' then out[#out + 1] = me .. ARGV[i + 1] end
  if #out == 0 then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], table.concat(out))
  end
end
return 0
"""


@dataclass(frozen=True, slots=True)
class Holder:
    """One node holding a block: its slot and the code of its highest tier holding it."""

    slot: int
    tier: int


class ClusterIndex:
    """Publishes one node's placements and answers where blocks are. Methods raise
    ``redis.RedisError`` when Redis does not answer."""

    def __init__(self, client: RedisClient, bits: int) -> None:
        self._redis = client
        self.bits = bits
        self._set = client.register_script(_SET)

    def publish(self, slot: int, changes: Sequence[tuple[str, bytes, int | None]]) -> int:
        """Record ``(namespace, block hash, tier code or None for gone)`` for node ``slot``;
        returns how many script calls it took (one per bucket touched)."""
        by_bucket: dict[str, list[bytes]] = defaultdict(list)
        for namespace, block_hash, tier in changes:
            args = by_bucket[bucket_key(namespace, block_hash, self.bits)]
            args += (field(block_hash), b"" if tier is None else bytes((tier,)))
        me = slot_bytes(slot)
        for pipe, keys in pipelines(self._redis, by_bucket):
            for key in keys:
                self._set(keys=[key], args=[me, *by_bucket[key]], client=pipe)
            pipe.execute()
        return len(by_bucket)

    def where(self, namespace: str, hashes: Sequence[bytes]) -> list[list[Holder]]:
        """The holders of each of ``hashes`` (an empty list where none is recorded)."""
        by_bucket: dict[str, list[int]] = defaultdict(list)
        for i, block_hash in enumerate(hashes):
            by_bucket[bucket_key(namespace, block_hash, self.bits)].append(i)
        out: list[list[Holder]] = [[] for _ in hashes]
        for pipe, keys in pipelines(self._redis, by_bucket):
            for key in keys:
                pipe.hmget(key, [field(hashes[i]) for i in by_bucket[key]])
            for key, values in zip(keys, pipe.execute(), strict=True):
                for i, value in zip(by_bucket[key], values, strict=True):
                    out[i] = [Holder(s, t) for s, t in records(value)]
        return out

    def correct(self, slot: int, namespace: str, hashes: Sequence[bytes]) -> None:
        """Remove node ``slot``'s records of ``hashes``: it answered that it holds none."""
        self.publish(slot, [(namespace, h, None) for h in hashes])
