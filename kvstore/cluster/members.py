"""Membership: each node's slot, heartbeat and report in Redis, and every node's state.

Time is Redis' own (``TIME`` inside the scripts), so the nodes' clocks never need to agree: a
node is ``up`` while its last heartbeat is at most ``suspect_after_s`` old by Redis' clock,
``suspect`` up to ``gone_after_s``, then ``gone``; after ``forget_after_s`` any node's
heartbeat prunes it from the list. A slot is never given to another node, nor again to a
pruned one (it joins anew under a new slot): the pruned slot's records are swept from the
index (:mod:`kvstore.cluster.sweep`) without racing a node that publishes under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.cluster.config import ClusterConfig
from kvstore.cluster.keys import MEMBERS, NEXT_SLOT, ORPHANS, REPORTS, SETTINGS, SLOTS
from kvstore.cluster.link import RedisClient
from kvstore.protocol.cluster import NodeReport, NodeState, NodeView

MAX_SLOT = (1 << 32) - 1

# KEYS: SLOTS, NEXT_SLOT, SETTINGS; ARGV: node id, index bits. The node's slot (given on first
# join) and the cluster's index bits (the first node's).
_JOIN = """
redis.call('HSETNX', KEYS[3], 'index_bits', ARGV[2])
local bits = tonumber(redis.call('HGET', KEYS[3], 'index_bits'))
local s = redis.call('HGET', KEYS[1], ARGV[1])
if not s then
  s = redis.call('INCR', KEYS[2])
  redis.call('HSET', KEYS[1], ARGV[1], s)
end
return {tonumber(s), bits}
"""

# KEYS: MEMBERS, REPORTS, SLOTS, ORPHANS; ARGV: node id, report JSON, forget-after ms, the
# node's slot. Records the beat at Redis' time unless the node's slot is no longer its own
# (it was pruned: it must join again, under a new slot), prunes nodes silent past forget-after
# (their slots go to ORPHANS, for their records to be swept, and are never given again), and
# returns {Redis' time in ms or -1 for a lost slot, how many slots await a sweep}.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[4] then
  return {-1, redis.call('SCARD', KEYS[4])}
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
for _, id in ipairs(old) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  local s = redis.call('HGET', KEYS[3], id)
  if s then
    redis.call('SADD', KEYS[4], s)
    redis.call('HDEL', KEYS[3], id)
  end
end
return {now, redis.call('SCARD', KEYS[4])}
"""

# KEYS: MEMBERS; ARGV: node id, gone-after ms. Dates its last beat back past gone-after.
_LEAVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now - tonumber(ARGV[2]) - 1, ARGV[1])
return now
"""

# KEYS: MEMBERS, REPORTS, SLOTS; ARGV: '1' for the reports too. Redis' time in ms, then id,
# last beat, slot and (with reports) report per node.
_LIST = """
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local full = ARGV[1] == '1'
for i = 1, #members, 2 do
  local id = members[i]
  out[#out + 1] = id
  out[#out + 1] = members[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[3], id) or '0'
  if full then out[#out + 1] = redis.call('HGET', KEYS[2], id) or '' end
end
return out
"""

# A roster reads every node's report (~500 bytes: tiers, blocks, rates) only every this many
# listings, or when it lists a node it has no report of; the other listings read each node's
# last beat and slot alone (the states, a few dozen bytes a node).
REPORTS_EVERY = 10


@dataclass(frozen=True, slots=True)
class Roster:
    """Every listed node at one moment, by Redis' clock."""

    nodes: list[NodeView]

    def up_slots(self) -> dict[int, NodeView]:
        """The nodes a peer may fetch from, by slot."""
        return {n.slot: n for n in self.nodes if n.state is NodeState.UP}


class Membership:
    """One node's membership calls. Every method raises ``redis.RedisError`` when Redis does
    not answer; the caller decides what that means (see :mod:`kvstore.cluster.node`)."""

    def __init__(self, client: RedisClient, config: ClusterConfig) -> None:
        self._config = config
        self._reports: dict[str, NodeReport] = {}  # as of the last listing that read them
        self._listings = 0
        self._join = client.register_script(_JOIN)
        self._beat = client.register_script(_BEAT)
        self._list = client.register_script(_LIST)
        self._leave = client.register_script(_LEAVE)

    def join(self) -> tuple[int, int]:
        """This node's slot (the same across restarts of the same node id) and the index bits
        of the cluster: the first node's setting, which every node then uses."""
        slot, bits = self._join(keys=[SLOTS, NEXT_SLOT, SETTINGS],
                                args=[self._config.node_id, self._config.index_bits])
        if not 1 <= int(slot) <= MAX_SLOT:
            raise ValueError(f"cluster slot {slot} out of range: the cluster has had more "
                             "node ids than the index can number")
        return int(slot), int(bits)

    def beat(self, slot: int, report: NodeReport) -> int | None:
        """One heartbeat of the node joined as ``slot``, carrying ``report``: how many pruned
        nodes' slots await a sweep of their records, or None if ``slot`` is no longer this
        node's (it was pruned meanwhile and must join again)."""
        forget_ms = int(self._config.forget_after_s * 1000)
        now, orphans = self._beat(keys=[MEMBERS, REPORTS, SLOTS, ORPHANS],
                                  args=[self._config.node_id, report.model_dump_json(),
                                        forget_ms, slot])
        return None if int(now) < 0 else int(orphans)

    def leave(self) -> None:
        """Say the node stopped: it is ``gone`` at once rather than after ``gone_after_s``."""
        self._leave(keys=[MEMBERS], args=[self._config.node_id,
                                          int(self._config.gone_after_s * 1000)])

    def roster(self) -> Roster:
        """Every listed node with its state now; its report as of the last listing that read
        the reports (:data:`REPORTS_EVERY`). Not thread-safe: one caller at a time."""
        full = self._listings % REPORTS_EVERY == 0
        self._listings += 1
        nodes = self._list_nodes(full)
        if not full and any(node_id not in self._reports for node_id, *_ in nodes):
            nodes = self._list_nodes(True)  # a node not seen yet: its report now
        out = []
        for node_id, silent, slot, report in nodes:
            if report is not None:
                self._reports[node_id] = report
            base = self._reports[node_id]
            out.append(NodeView(**base.model_dump(), slot=slot, state=self._state(silent),
                                silent_s=round(silent, 3)))
        if full:  # forget the reports of nodes no longer listed
            self._reports = {n.node_id: self._reports[n.node_id] for n in out}
        return Roster(out)

    def _list_nodes(self, full: bool) -> list[tuple[str, float, int, NodeReport | None]]:
        """``(node id, seconds silent, slot, report or None)`` of every listed node."""
        raw = self._list(keys=[MEMBERS, REPORTS, SLOTS], args=["1" if full else "0"])
        now_ms = float(raw[0])
        step = 4 if full else 3
        out = []
        for i in range(1, len(raw), step):
            node_id, last, slot = _text(raw[i]), raw[i + 1], raw[i + 2]
            report = None
            if full:
                text = raw[i + 3]
                report = NodeReport.model_validate_json(text) if text else \
                    NodeReport(node_id=node_id, address="", version="", started_at=0)
            out.append((node_id, max(0.0, (now_ms - float(last)) / 1000), max(1, int(slot)),
                        report))
        return out

    def _state(self, silent_s: float) -> NodeState:
        if silent_s <= self._config.suspect_after_s:
            return NodeState.UP
        if silent_s <= self._config.gone_after_s:
            return NodeState.SUSPECT
        return NodeState.GONE


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
