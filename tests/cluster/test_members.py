"""Membership in a real Redis: slots that survive restarts, heartbeats on Redis' clock, and
the up -> suspect -> gone states within the configured times."""

from __future__ import annotations

import time

from kvstore.cluster.link import connect
from kvstore.cluster.members import REPORTS_EVERY, Membership
from kvstore.protocol.cluster import NodeReport, NodeState
from kvstore.testing.redis_server import RedisServer
from tests.cluster.conftest import quick


def report(node_id: str) -> NodeReport:
    return NodeReport(node_id=node_id, address="127.0.0.1:1", version="t", started_at=1.0,
                      blocks=3)


def test_slots_are_distinct_and_stable_per_node_id(redis_server: RedisServer) -> None:
    client, clustered = connect(redis_server.url)
    assert not clustered
    a = Membership(client, quick(redis_server.url, "a"))
    b = Membership(client, quick(redis_server.url, "b"))
    (slot_a, bits_a), (slot_b, bits_b) = a.join(), b.join()
    assert slot_a != slot_b and bits_a == bits_b == 16
    assert Membership(client, quick(redis_server.url, "a")).join() == (slot_a, 16)


def test_every_node_takes_the_first_nodes_index_bits(redis_server: RedisServer) -> None:
    client, _ = connect(redis_server.url)
    assert Membership(client, quick(redis_server.url, "a", index_bits=12)).join()[1] == 12
    assert Membership(client, quick(redis_server.url, "b", index_bits=20)).join()[1] == 12


def test_a_silent_node_turns_suspect_then_gone_and_a_leaving_one_gone_at_once(
        redis_server: RedisServer) -> None:
    client, _ = connect(redis_server.url)
    a = Membership(client, quick(redis_server.url, "a"))
    b = Membership(client, quick(redis_server.url, "b"))
    c = Membership(client, quick(redis_server.url, "c"))
    slots = {name: m.join()[0] for m, name in ((a, "a"), (b, "b"), (c, "c"))}
    for m, name in ((a, "a"), (b, "b"), (c, "c")):
        m.beat(slots[name], report(name))
    states = {n.node_id: n.state for n in a.roster().nodes}
    assert states == {"a": NodeState.UP, "b": NodeState.UP, "c": NodeState.UP}
    c.leave()
    assert {n.node_id: n.state for n in a.roster().nodes}["c"] is NodeState.GONE
    seen: dict[str, set[NodeState]] = {"b": set()}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # a keeps beating, b is silent
        a.beat(slots["a"], report("a"))
        roster = {n.node_id: n for n in a.roster().nodes}
        assert roster["a"].state is NodeState.UP
        seen["b"].add(roster["b"].state)
        if roster["b"].state is NodeState.GONE:
            break
        time.sleep(0.05)
    assert seen["b"] >= {NodeState.SUSPECT, NodeState.GONE}
    view = {n.node_id: n for n in a.roster().nodes}["b"]
    assert view.silent_s > 1.0 and view.blocks == 3 and view.address == "127.0.0.1:1"


def test_a_node_silent_past_forget_after_is_pruned_and_comes_back_under_a_new_slot(
        redis_server: RedisServer) -> None:
    client, _ = connect(redis_server.url)
    a = Membership(client, quick(redis_server.url, "a", forget_after_s=1.5))
    b = Membership(client, quick(redis_server.url, "b", forget_after_s=1.5))
    slots = {name: m.join()[0] for m, name in ((a, "a"), (b, "b"))}
    for m, name in ((a, "a"), (b, "b")):
        assert m.beat(slots[name], report(name)) == 0
    time.sleep(1.7)
    assert a.beat(slots["a"], report("a")) == 1  # b pruned: its slot awaits a sweep
    assert [n.node_id for n in a.roster().nodes] == ["a"]
    # b, still running, finds out at its next beat that its slot is gone, and joins anew:
    # the records left under its old slot are swept, never taken for its new ones
    assert b.beat(slots["b"], report("b")) is None
    assert [n.node_id for n in a.roster().nodes] == ["a"]
    new_slot = b.join()[0]
    assert new_slot not in slots.values()
    assert b.beat(new_slot, report("b")) == 1
    assert sorted(n.node_id for n in a.roster().nodes) == ["a", "b"]


def test_a_roster_reads_the_reports_every_tenth_listing_and_a_new_nodes_at_once(
        redis_server: RedisServer) -> None:
    client, _ = connect(redis_server.url)
    a = Membership(client, quick(redis_server.url, "a"))
    slot = a.join()[0]

    def beat(blocks: int) -> None:
        a.beat(slot, report("a").model_copy(update={"blocks": blocks}))

    def blocks() -> dict[str, int]:
        return {n.node_id: n.blocks for n in a.roster().nodes}
    beat(1)
    assert blocks() == {"a": 1}  # the first listing reads the reports
    beat(2)
    assert blocks() == {"a": 1}  # the next ones the states alone
    b = Membership(client, quick(redis_server.url, "b"))
    b.beat(b.join()[0], report("b"))
    assert blocks() == {"a": 2, "b": 3}  # a node not seen yet: every report read again
    beat(4)
    assert [blocks() for _ in range(REPORTS_EVERY - 3)] == [{"a": 2, "b": 3}] * 7
    assert blocks() == {"a": 4, "b": 3}  # the tenth listing
    b.leave()
    assert {n.node_id: n.state for n in a.roster().nodes}["b"] is NodeState.GONE  # at once
