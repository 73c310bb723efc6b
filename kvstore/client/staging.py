"""The clients' pool of staged shared-memory places (see :mod:`kvstore.store.staging`).

A local put copies blocks into places the server staged for this client and publishes them
in one round trip; the reply stages as many new places, which go back in the pool. Places
belong to one server instance (a restarted server starts a new pool) and one namespace (its
block size). When the server stages fewer places than a batch needs (it caps staging per
client), batches that large take the two-round-trip path for a while.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstore.client.shm import write_fenced

if TYPE_CHECKING:
    from kvstore.client.shm import SlabMapping
    from kvstore.protocol.frame import Buffer

STAGE_RETRY_S = 30.0  # after the server staged too few places for a batch size, reserve instead

Place = list[Any]  # one place: [[offset, length], ...]


class StagedPlaces:
    """Thread-safe: concurrent puts take disjoint places. A put takes :meth:`pooled` places,
    asks ``shm_stage`` for the rest, then checks it has :meth:`enough`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[str, list[Place]] = {}
        self._short: dict[str, tuple[int, float]] = {}  # ns -> (batch size, retry after)
        self._instance: str | None = None
        self._gens: dict[int, int | None] = {}  # a place's first offset -> its generation

    def pooled(self, instance: str, ns: str, n: int) -> list[Place] | None:
        """Up to ``n`` pooled places (the caller stages the rest, then calls :meth:`enough`);
        None while batches of ``n`` are known to need more than the server stages."""
        with self._lock:
            if self._instance != instance:  # a restarted server: its places are new
                self._pools, self._short, self._instance = {}, {}, instance
                self._gens = {}
            short = self._short.get(ns)
            if short is not None and n >= short[0] and time.monotonic() < short[1]:
                return None
            pool = self._pools.setdefault(ns, [])
            places, pool[:] = pool[:n], pool[n:]
            return places

    def enough(self, instance: str, ns: str, n: int, places: list[Place]) -> list[Place] | None:
        """``places`` if there are ``n`` of them; else they go back to the pool, batches of
        ``n`` reserve instead for a while, and None."""
        if len(places) >= n:
            return places
        self.give_back(instance, ns, places)
        with self._lock:
            self._short[ns] = (n, time.monotonic() + STAGE_RETRY_S)
        return None

    def fill(self, slab: SlabMapping, instance: str, ns: str, places: list[Place],
             blocks: Sequence[Buffer]) -> list[int | None]:
        """Copy ``blocks`` into ``places``; their checksums (for the commit). On failure the
        places go back to the pool (the server has not seen them) and the error is raised."""
        try:
            return [write_fenced(slab, ext, block, self.gen(ext))
                    for ext, block in zip(places, blocks, strict=True)]
        except BaseException:
            self.give_back(instance, ns, places)
            raise

    def settle(self, instance: str, ns: str, places: list[Place], used: list[int],
               staged: list[Place], gens: Sequence[int | None]) -> None:
        """After an ``shm_put`` of ``places``: the ones the server did not use (their blocks
        were stored already) and the freshly staged ones go back to the pool. A put that got
        no reply keeps none of its places: the server may have published them as blocks, and
        writing into them again would overwrite stored bytes."""
        kept = set(used)
        self.give_back(instance, ns, [ext for ext in places if ext[0][0] not in kept])
        self.give_back(instance, ns, staged, gens)

    def give_back(self, instance: str, ns: str, places: list[Place],
                  gens: Sequence[int | None] | None = None) -> None:
        """Pool ``places``; ``gens``: the generations of newly staged ones."""
        with self._lock:
            if self._instance == instance:
                self._pools.setdefault(ns, []).extend(places)
        if gens is not None:
            self.record(places, gens)

    def record(self, places: list[Place], gens: Sequence[int | None]) -> None:
        """Remember the generation each newly staged place was handed out with."""
        with self._lock:
            self._gens.update((p[0][0], g) for p, g in zip(places, gens, strict=True))

    def gen(self, place: Place) -> int | None:
        """The generation a place was staged with (None if the server gave none)."""
        return self._gens.get(place[0][0])

    def forget(self, ns: str) -> None:
        """Drop the pool of ``ns`` (the server no longer holds those places)."""
        with self._lock:
            for place in self._pools.pop(ns, []):
                self._gens.pop(place[0][0], None)

    def held(self, ns: str) -> int:
        with self._lock:
            return len(self._pools.get(ns, ()))
