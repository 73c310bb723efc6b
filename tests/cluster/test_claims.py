"""One definition per namespace name across a cluster (real stores, a real ``redis-server``):
a node is refused a namespace that a live node holds with another definition, with the
fields that differ named; deleting it there, or that node being gone, lifts the refusal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.cluster.node import ClusterNode
from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import NamespaceConflictError
from kvstore.namespace import Layout, Namespace
from kvstore.store import Store
from kvstore.testing.redis_server import RedisServer
from tests.cluster.conftest import quick, wait_for

B = 4096


def chat(block_bytes: int = B, model: str = "tiny") -> Namespace:
    return Namespace("chat", block_bytes, Layout(model_id=model, block_size=16))



@pytest.fixture
def nodes(redis_server: RedisServer, tmp_path: Path) -> Iterator[list[tuple[Store, ClusterNode]]]:
    made = []
    for name in ("a", "b"):
        store = Store(StoreConfig((TierConfig("host", 8 * B, options={"slot_bytes": B}),),
                                  namespaces_path=str(tmp_path / name / "ns.json")))
        node = ClusterNode(quick(redis_server.url, name), store, "test")
        node.start()
        made.append((store, node))
    wait_for(lambda: all(len(n.status().nodes) == 2 for _, n in made))
    yield made
    for store, node in made:
        node.close()
        store.close()


def test_a_namespace_held_elsewhere_with_another_definition_is_refused(
        nodes: list[tuple[Store, ClusterNode]]) -> None:
    (a, node_a), (b, node_b) = nodes
    assert a.register_namespace(chat())
    with pytest.raises(NamespaceConflictError, match=r"node 'a'.*block_bytes \(8192 here, 4096"):
        b.register_namespace(chat(8192))
    with pytest.raises(NamespaceConflictError, match=r"layout\.model_id"):
        b.register_namespace(chat(model="other"))
    assert [ns.name for ns in b.namespaces()] == []  # refused before anything was kept
    assert b.register_namespace(chat())  # the same definition: welcome
    a.delete_namespace("chat")
    b.delete_namespace("chat")
    assert b.register_namespace(chat(8192))  # nobody holds the old one any more
    node_b.close()  # b is gone: its definition no longer binds a
    wait_for(lambda: {n.node_id: n.state.value for n in node_a.status().nodes}["b"] == "gone")
    assert a.register_namespace(chat())
