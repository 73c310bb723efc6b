"""Sweeping the index records of forgotten nodes.

A node silent past ``forget_after_s`` is pruned by another node's heartbeat and its slot goes
to the set of orphans (:mod:`kvstore.cluster.members`); no node publishes under that slot
again, not even the same node should it come back (it joins under a new slot). Its records
would stay in the index for good: readers skip them (no node is up under that slot), but
they cost Redis memory. One node at a time sweeps them: the holder of the sweeper lease
(``SET NX PX``, renewed at each step) walks every index bucket (``SCAN`` of ``kvs:ix:*`` on
each Redis server, one page per step) and rewrites each without the orphans' records; when
the walk ends those slots leave the set. A sweeper that stops midway leaves its lease to run
out, and another node walks again from the start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.cluster import RedisCluster

from kvstore.cluster.keys import INDEX_MATCH, ORPHANS, SWEEPER, slot_bytes
from kvstore.cluster.link import RedisClient

PAGE = 256  # bucket keys asked of SCAN per step
LEASE_MS = 30_000  # a sweeper that takes no step for this long loses the walk

# KEYS: one bucket; ARGV: the orphans' slots (4 bytes each). Removes their records; returns
# how many it removed.
_SWEEP = """
local gone = {}
for i = 1, #ARGV do gone[ARGV[i]] = true end
local all = redis.call('HGETALL', KEYS[1])
local removed = 0
for i = 1, #all, 2 do
  local v = all[i + 1]
  local out = {}
  for j = 1, #v, 5 do
    local rec = string.sub(v, j, j + 4)
    if gone[string.sub(rec, 1, 4)] then removed = removed + 1 else out[#out + 1] = rec end
  end
  if #out == 0 then
    redis.call('HDEL', KEYS[1], all[i])
  elseif #out * 5 ~= #v then
    redis.call('HSET', KEYS[1], all[i], table.concat(out))
  end
end
return removed
"""

# KEYS: SWEEPER; ARGV: node id, lease ms. Takes the lease, or renews it if this node holds it.
_LEASE = """
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: SWEEPER, ORPHANS; ARGV: node id, the swept slots. Ends a walk this node still leads.
_DONE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = 2, #ARGV do redis.call('SREM', KEYS[2], ARGV[i]) end
redis.call('DEL', KEYS[1])
return 1
"""


@dataclass(slots=True)
class _Walk:
    """One sweep in progress: the slots it removes, and where it is."""

    slots: list[int]
    servers: list[RedisClient]
    at: int = 0  # the server being scanned
    cursor: int = 0


class Sweeper:
    """One node's part in sweeping: asks for the lease at most every ``ask_every_s``, then
    takes one step per :meth:`step` while it leads. Methods raise ``redis.RedisError`` when
    Redis does not answer (the walk is then dropped)."""

    def __init__(self, client: RedisClient, node_id: str, ask_every_s: float) -> None:
        self._client = client
        self._node_id = node_id
        self._ask_every_s = ask_every_s
        self._asked = 0.0
        self._walk: _Walk | None = None
        self._sweep = client.register_script(_SWEEP)
        self._lease = client.register_script(_LEASE)
        self._done = client.register_script(_DONE)
        self.swept = 0  # records removed by this node's walks

    @property
    def leading(self) -> bool:
        """Whether this node is walking the index now."""
        return self._walk is not None

    def resign(self) -> None:
        """Give the lease back if this node holds it (a node that stops): another node walks
        again at once rather than after the lease runs out."""
        self._walk = None
        self._done(keys=[SWEEPER, ORPHANS], args=[self._node_id])

    def step(self) -> None:
        """One page of the walk if this node leads one (or becomes the leader now)."""
        try:
            self._step()
        except BaseException:
            self._walk = None
            raise

    def _step(self) -> None:
        walk = self._walk
        if walk is None:
            now = time.monotonic()
            if now - self._asked < self._ask_every_s:
                return
            self._asked = now
            if not self._lease(keys=[SWEEPER], args=[self._node_id, LEASE_MS]):
                return
            slots = sorted(int(s) for s in self._client.smembers(ORPHANS))
            if not slots:
                self._done(keys=[SWEEPER, ORPHANS], args=[self._node_id])
                return
            walk = self._walk = _Walk(slots, _servers(self._client))
        elif not self._lease(keys=[SWEEPER], args=[self._node_id, LEASE_MS]):
            self._walk = None  # the lease ran out and another node leads now
            return
        server = walk.servers[walk.at]
        cursor, keys = server.scan(walk.cursor, match=INDEX_MATCH, count=PAGE)
        if keys:
            gone = [slot_bytes(s) for s in walk.slots]
            pipe = server.pipeline(transaction=False)
            for key in keys:
                self._sweep(keys=[key], args=gone, client=pipe)
            self.swept += sum(int(n) for n in pipe.execute())
        walk.cursor = int(cursor)
        if walk.cursor == 0:
            walk.at += 1
        if walk.at == len(walk.servers):
            self._done(keys=[SWEEPER, ORPHANS], args=[self._node_id, *walk.slots])
            self._walk = None


def _servers(client: RedisClient) -> list[RedisClient]:
    """Every Redis server holding index buckets: the one, or each master of a Redis Cluster."""
    if isinstance(client, RedisCluster):
        return [client.get_redis_connection(n) for n in client.get_primaries()]
    return [client]
