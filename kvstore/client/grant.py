"""Granted reads: look up a chain and pin its host-resident blocks in one round trip.

An engine's scheduler and its workers are different processes, each with its own client. The
scheduler asks :meth:`KVStoreClient.lookup_acquire`: the server answers the lookup and, for each
block of the hit that its host tier holds, pins it and returns its extents in the shared slab
(op ``shm_lookup``). The scheduler passes the :class:`Grant` to the workers, which copy the
bytes straight out of their own mapping of the slab (:meth:`KVStoreClient.mapped_slab`) with no
round trip, and then :meth:`KVStoreClient.release_grant` drops the pins.

A grant is only good while its pins hold: for ``lease_s`` seconds, and only in the server
instance that made it (a restarted server's slab is a new segment). Readers check both. The
pins do not go the moment the granting client's last connection closes (a worker may be
copying them): a release, the end of the lease (at most the server's ``max_lease_s``) or the
server's ``grant_grace_s`` after that last connection closed drops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.client.errors import ProtocolError
from kvstore.client.exchange import Call, Link, Steps
from kvstore.protocol import (
    Extents,
    Lookup,
    LookupReply,
    ReleaseReply,
    ShmLookup,
    ShmLookupReply,
    ShmRelease,
)
from kvstore.types import BlockHash


@dataclass(frozen=True, slots=True)
class Grant:
    """A lookup whose host-resident blocks are pinned for reading.

    ``extents[i]`` locates block ``i`` of the hit in the slab of server ``instance`` (None
    where only a lower tier holds it, or without shared memory, in which case ``instance`` is
    empty). Release the hashes that have extents with :meth:`KVStoreClient.release_grant`.
    ``gens[i]`` is block ``i``'s generation: a reader checks it after copying
    (``SlabMapping.read(ext, gen)``), and a moved number means the copy is not that block.
    ``sums[i]`` is its recorded checksum (xxh3-64): a reader hashes what it copied and counts
    a copy that differs as a miss (``SlabMapping.read_summed``).
    """

    prefix_blocks: int
    tiers: list[str]
    extents: list[Extents | None]
    instance: str
    gens: list[int | None] = field(default_factory=list)
    sums: list[int | None] = field(default_factory=list)

    def granted(self, hashes: Sequence[bytes]) -> list[BlockHash]:
        """The hashes of the hit that this grant pinned (``hashes`` as looked up)."""
        return [BlockHash(bytes(h)) for h, e in zip(hashes, self.extents, strict=False)
                if e is not None]


def lookup_acquire(link: Link, ns: str, hashes: Sequence[BlockHash],
                   lease_s: float | None) -> Steps[Grant]:
    """Steps of :meth:`KVStoreClient.lookup_acquire`: ``shm_lookup``, or without the slab a
    plain ``lookup`` (no extents)."""
    if link.slab is None:
        header, _ = yield Call(Lookup(ns, list(hashes)))
        found = LookupReply.from_header(header)
        n = int(found.prefix_blocks)
        return Grant(n, list(found.tiers), [None] * n, "")
    header, _ = yield Call(ShmLookup(ns, list(hashes), lease_s))
    reply = ShmLookupReply.from_header(header)
    extents, n = list(reply.extents), int(reply.prefix_blocks)
    if len(extents) != n:
        raise ProtocolError(f"shm_lookup returned {len(extents)} extents for a hit of {n} blocks")
    return Grant(n, list(reply.tiers), extents, link.info.instance, list(reply.gens),
                 list(reply.sums))


def release_grant(_: Link, ns: str, hashes: Sequence[BlockHash], wait: bool) -> Steps[int]:
    """Steps of :meth:`KVStoreClient.release_grant` (``shm_release`` with ``grant``)."""
    header, _blocks = yield Call(ShmRelease(ns, list(hashes), grant=True), noreply=not wait)
    return int(ReleaseReply.from_header(header).released) if wait else 0
