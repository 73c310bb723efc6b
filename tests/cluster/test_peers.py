"""The peer pool's cooldown: a peer that failed is not read from again until it runs out, so
a peer cut off (which takes the whole timeout to fail) costs one read that wait, not all."""

from __future__ import annotations

import time

from kvstore.cluster.peers import Peers
from kvstore.protocol.cluster import NodeState, NodeView


def node(name: str, port: int) -> NodeView:
    return NodeView(node_id=name, address=f"127.0.0.1:{port}",
                    rest_url=f"http://127.0.0.1:{port}", version="t", started_at=0, slot=1,
                    state=NodeState.UP, silent_s=0)


def test_a_failed_peer_is_left_alone_for_the_cooldown_then_tried_again() -> None:
    peers = Peers(None, timeout_s=1.0, cooldown_s=0.3)
    a, b = node("a", 1), node("b", 2)
    assert peers.usable(a) and peers.usable(b)
    peers.forget(a)  # a read from it failed
    assert not peers.usable(a) and peers.usable(b)
    time.sleep(0.35)
    assert peers.usable(a)
    peers.close()
