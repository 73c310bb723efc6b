"""One definition per namespace name across the cluster.

Each node notes in Redis the definition of every namespace it holds
(``kvs:ns:<name>``: a hash, node id -> the definition as JSON). A node registering a namespace
is refused when a node that is not gone holds one of that name with another definition (block
size, layout, hash algorithm or seed, tenant): blocks under one name must be interchangeable
between nodes, or a peer would serve KV of another shape. The check and the note are one
script, so two nodes registering different definitions at once cannot both succeed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from kvstore.cluster.keys import PREFIX
from kvstore.cluster.link import RedisClient
from kvstore.errors import NamespaceConflictError
from kvstore.namespace import Namespace, differences

# KEYS: the namespace's key; ARGV: node id, definition, then the ids of nodes not gone. The
# first differing definition of a live node ({id, definition}), else {} once noted.
_CLAIM = """
local live = {}
for i = 3, #ARGV do live[ARGV[i]] = true end
local held = redis.call('HGETALL', KEYS[1])
for i = 1, #held, 2 do
  if held[i] ~= ARGV[1] and live[held[i]] and held[i + 1] ~= ARGV[2] then
    return {held[i], held[i + 1]}
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {}
"""


def key(name: str) -> str:
    return f"{PREFIX}:ns:{name}"


def definition(ns: Namespace) -> str:
    return json.dumps(ns.to_dict(), sort_keys=True, separators=(",", ":"))


class Claims:
    """This node's claims, over one Redis client. Methods raise ``redis.RedisError`` when
    Redis does not answer."""

    def __init__(self, client: RedisClient, node_id: str) -> None:
        self._redis = client
        self._node_id = node_id
        self._claim = client.register_script(_CLAIM)

    def claim(self, ns: Namespace, live: Iterable[str]) -> None:
        mine = definition(ns)
        found = self._claim(keys=[key(ns.name)], args=[self._node_id, mine, *live])
        if found:
            node_id, theirs = (v.decode() if isinstance(v, bytes) else v for v in found)
            diff = differences(json.loads(mine), json.loads(theirs), ("here", "there"))
            raise NamespaceConflictError(
                f"namespace {ns.name!r} is held by cluster node {node_id!r} with another "
                f"definition: {', '.join(diff)}")

    def release(self, name: str) -> None:
        self._redis.hdel(key(name), self._node_id)
