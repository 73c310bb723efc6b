"""The host tier's reservations: blocks being written into host-slab places, invisible to
every reader until published, and how each one ends.

Two kinds of writer hold a reservation:

- a client through shared memory (``shm_reserve``): the server cannot stop a process that
  has the mapping, so its reservation is simply freed when it ends (committed, aborted, its
  lease run out, its owner gone, its namespace deleted); the generations handed out with the
  extents fence what such a client copies late (:mod:`kvstore.store.host_path`).
- the server itself, receiving bytes into the places over time (``receiving=True``: a socket
  put read straight into the slab, :mod:`server.dataplane.direct_put`). Its bytes keep
  landing in the places until it commits or aborts. If a namespace delete, the lease running
  out or its owner's leases being dropped freed them sooner, the free list would hand them
  to another block, stored and acknowledged, under the rest of the payload.

So whatever ends a *receiving* reservation other than its own writer only **dooms** it
(:meth:`Reservations.end`): the block's key is forgotten at once (the index and this table
drop it: no reader sees it, another writer may reserve the same key elsewhere, a namespace
delete is complete), but its slots stay reserved in the slab under a placeholder key. The
writer's commit of a doomed key is refused, and its commit or abort
(:meth:`Reservations.end_doomed`) is what frees the slots. Why this is sound:

- a slot goes back to the free list only when nothing can write into it any more: the writer
  says so by committing or aborting, and the allocator cannot hand out a reserved slot;
- a doomed block can never become visible: its key is no longer reserved under its owner,
  so the commit publishes nothing, and its placeholder is in no namespace;
- nothing leaks: the data plane ends every receiving frame in a commit or an abort (the
  connection aborts it when it is lost, times out after ``frame_timeout_s`` or the server
  shuts down, and a commit that fails aborts), and closing the store frees every place. The
  placeholders stay charged to the host tier meanwhile, so capacity accounting holds, and
  :meth:`Reservations.places` lets the store's integrity check see every slot accounted for.

Every method expects the store lock to be held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from kvstore.store.ledger import Ledger
from kvstore.store.stack import TierStack
from kvstore.tiers.slots import Extents
from kvstore.types import BlockKey

DOOMED_NS = "\x00doomed"  # placeholder keys of doomed receiving places; no namespace has NUL


class Held(NamedTuple):
    """One reservation: who writes it, when it runs out (monotonic), its host-slab extents,
    and whether the server itself is receiving into it."""

    owner: str
    expiry: float
    extents: Extents
    receiving: bool = False


class Reservations:
    """Every reservation of the host tier and the doomed places of receiving writers."""

    def __init__(self, stack: TierStack, ledger: Ledger, next_ids: Callable[[int], int]) -> None:
        self._stack = stack
        self._ledger = ledger
        self._next_ids = next_ids
        self._held: dict[BlockKey, Held] = {}
        # (owner, key) -> placeholder: a receiving writer's places, doomed, not yet freed
        self._doomed: dict[tuple[str, BlockKey], BlockKey] = {}

    def add(self, key: BlockKey, held: Held) -> None:
        """Record a reservation the slab and the ledger just made."""
        self._held[key] = held

    def get(self, key: BlockKey) -> Held | None:
        return self._held.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def published(self, key: BlockKey) -> None:
        """The block was published: its reservation is over (the slots are the block's)."""
        del self._held[key]

    def free(self, key: BlockKey) -> None:
        """Free a reservation: its writer aborted, or the store is closing. Ignores a key
        that is not reserved."""
        self._held.pop(key, None)
        if self._ledger.unreserve(key):
            self._stack.slab().unreserve(key)

    def end(self, key: BlockKey) -> None:
        """End a reservation for someone other than its writer (a namespace delete, the
        lease run out, its owner gone): freed, or doomed if the server is receiving into it
        (see the module docstring)."""
        held = self._held.get(key)
        if held is None or not held.receiving:
            self.free(key)
            return
        placeholder = (DOOMED_NS, str(self._next_ids(1)).encode())
        self._stack.slab().rekey_reserved([(key, placeholder)])  # the slots stay held
        del self._held[key]
        self._ledger.unreserve(key)  # the key is free: invisible, reservable again
        self._doomed[(held.owner, key)] = placeholder

    def end_doomed(self, owner: str, keys: Iterable[BlockKey]) -> set[BlockKey]:
        """Free the doomed places of ``owner``'s ``keys`` (it committed or aborted: nothing
        writes there any more); the keys that were doomed."""
        ended: set[BlockKey] = set()
        if not self._doomed:
            return ended
        slab = self._stack.slab()
        for key in keys:
            placeholder = self._doomed.pop((owner, key), None)
            if placeholder is not None:
                slab.unreserve(placeholder)
                ended.add(key)
        return ended

    def expired(self, owner: str | None, now: float) -> list[BlockKey]:
        """Keys whose reservation ran out by ``now``, or (with ``owner``) that owner holds."""
        return [key for key, held in self._held.items()
                if (owner is not None and held.owner == owner) or held.expiry <= now]

    def of_namespace(self, namespace: str) -> list[BlockKey]:
        return [key for key in self._held if key[0] == namespace]

    def close(self) -> None:
        """Free every reservation and doomed place (the store is closing: no writer is left
        that could still write, the data plane cut its connections first)."""
        for key in list(self._held):
            self.free(key)
        if self._doomed:
            slab = self._stack.slab()
            for placeholder in self._doomed.values():
                slab.unreserve(placeholder)
            self._doomed.clear()

    def places(self) -> set[BlockKey]:
        """The slab keys held for reservations: reserved keys and doomed placeholders."""
        return {*self._held, *self._doomed.values()}
