"""Granted reads: look up a chain and pin its host-resident blocks in one round trip.

An engine's scheduler and its workers are different processes, each with its own client. The
scheduler asks :meth:`GrantedReads.lookup_acquire`: the server answers the lookup and, for each
block of the hit that its host tier holds, pins it and returns its extents in the shared slab
(op ``shm_lookup``). The scheduler passes the :class:`Grant` to the workers, which copy the
bytes straight out of their own mapping of the slab (:meth:`GrantedReads.mapped_slab`) with no
round trip, and then :meth:`GrantedReads.release_grant` drops the pins.

A grant is only good while its pins hold: for ``lease_s`` seconds, and only in the server
instance that made it (a restarted server's slab is a new segment). Readers check both. The
pins do not go with the granting client's connections (a reconnect must not free slots a
worker is copying): only a release or the end of the lease drops them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kvstore.client.errors import KVStoreClientError, ProtocolError

if TYPE_CHECKING:
    from kvstore.client.discovery import ServerInfo
    from kvstore.client.shm import Extents, SlabMapping
    from kvstore.client.socket_conn import FrameSocket

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Grant:
    """A lookup whose host-resident blocks are pinned for reading.

    ``extents[i]`` locates block ``i`` of the hit in the slab of server ``instance`` (None
    where only a lower tier holds it, or without shared memory, in which case ``instance`` is
    empty). Release the hashes that have extents with :meth:`GrantedReads.release_grant`.
    """

    prefix_blocks: int
    tiers: list[str]
    extents: list[Extents | None]
    instance: str

    def granted(self, hashes: Sequence[bytes]) -> list[bytes]:
        """The hashes of the hit that this grant pinned (``hashes`` as looked up)."""
        return [bytes(h) for h, e in zip(hashes, self.extents, strict=False) if e is not None]


class GrantedReads:
    """Mixin of :class:`kvstore.client.KVStoreClient`; uses its session and retry helpers."""

    if TYPE_CHECKING:
        def _session(self) -> tuple[FrameSocket, ServerInfo, SlabMapping | None]: ...
        def _retry(self, fn: Callable[[], T]) -> T: ...
        def _call(self, header: dict[str, Any], wait: bool = True) -> dict[str, Any]: ...

    def lookup_acquire(self, namespace: str, hashes: Sequence[bytes],
                       lease_s: float | None = None) -> Grant:
        """Look up ``hashes`` and pin, for ``lease_s`` seconds (server default if None), each
        block of the hit that the host tier holds; nothing is promoted. Without shared memory
        this is a plain lookup and no extents come back."""
        hs = list(hashes)

        def call() -> Grant:
            conn, info, slab = self._session()
            if slab is None:
                reply = conn.request({"op": "lookup", "ns": namespace, "hashes": hs})[0]
                n = int(reply["prefix_blocks"])
                return Grant(n, list(reply["tiers"]), [None] * n, "")
            reply = conn.request({"op": "shm_lookup", "ns": namespace, "hashes": hs,
                                  "lease_s": lease_s})[0]
            extents = list(reply["extents"])
            n = int(reply["prefix_blocks"])
            if len(extents) != n:
                raise ProtocolError(
                    f"shm_lookup returned {len(extents)} extents for a hit of {n} blocks")
            return Grant(n, list(reply["tiers"]), extents, info.instance)

        return self._retry(call)

    def release_grant(self, namespace: str, hashes: Sequence[bytes], *,
                      wait: bool = True) -> int:
        """Drop the pins of a :class:`Grant` on ``hashes``; how many were held (0 with
        ``wait=False``, which does not wait for the answer). Grant pins outlive this client's
        connections (another process may be copying them): release them, or they stay until
        their lease runs out."""
        reply = self._call({"op": "shm_release", "ns": namespace, "hashes": list(hashes),
                            "grant": True}, wait)
        return int(reply.get("released", 0))

    def mapped_slab(self, instance: str) -> SlabMapping | None:
        """This client's mapping of the slab of server ``instance``, or None when it is
        connected elsewhere, has no shared memory or cannot connect. The mapping stays valid
        until the client is closed or reconnects."""
        try:
            _, info, slab = self._session()
        except (OSError, KVStoreClientError):
            return None
        return slab if instance and info.instance == instance else None
