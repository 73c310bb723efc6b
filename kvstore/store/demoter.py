"""Demotion off the request path: a thread settles the host tier from its high watermark down
to its low one by moving its coldest blocks to the persistent tier below, a batch at a time,
holding the store lock only to pick a batch (and copy its bytes out of the slab) and to record
the result. Each block's bytes are checked against its recorded checksum before they go down
(:mod:`kvstore.store.verify`). The write below (one LMDB transaction, and its fsync, per
batch) runs without it, so reads and puts beside a demoting put no longer wait for the disk.

The request path still makes room itself when a write would not fit at all
(:meth:`~kvstore.store.placer.Placer.make_room`); only the settling that followed every write
moves here. A block picked for a batch stays readable where it is until its copy below is
recorded. If it is deleted or replaced meanwhile, the copy written below is deleted again
(unless the index now says the lower tier holds it); if the request path evicted it meanwhile,
it copied the block down itself and the batch's write was a harmless duplicate.
"""

from __future__ import annotations

import logging
import math
import threading

from kvstore.checksum import checksum, checksums
from kvstore.errors import CapacityError, TierUnavailableError
from kvstore.store.books import Books
from kvstore.store.index import Entry
from kvstore.store.ledger import GONE, KEPT
from kvstore.store.lock import StoreLock
from kvstore.store.placer import MAX_DEMOTE_BATCH, Item, Placer
from kvstore.store.stack import TierStack
from kvstore.tiers.base import BlockMeta
from kvstore.types import BlockKey

log = logging.getLogger("kvstore.store")
Batch = list[tuple[Item, Entry]]


class Demoter:
    """Settles tier ``pos`` into tier ``pos + 1`` from a thread of its own. Takes the store
    lock itself, through its :class:`~kvstore.store.lock.StoreLock` (the
    caller of :meth:`signal` may hold it)."""

    def __init__(self, stack: TierStack, books: Books, placer: Placer, lock: StoreLock,
                 pos: int) -> None:
        self._stack, self._tiers, self._placer, self._lock = stack, stack.tiers, placer, lock
        self._ledger, self._tally, self._leases = books.ledger, books.tally, books.leases
        self._exits, self._checks = books.exits, books.checks
        self.pos, self.low = pos, pos + 1
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._busy = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="kvstore-demote", daemon=True)
        self._thread.start()

    @classmethod
    def settling(cls, stack: TierStack, books: Books, placer: Placer,
                 lock: StoreLock) -> Demoter | None:
        """The host tier's demoter, started and made its settler, where a persistent tier
        sits right below it; None elsewhere."""
        host, tiers = stack.host, stack.tiers
        if host is None or host + 1 >= len(tiers) or not tiers[host + 1].persistent:
            return None
        demoter = cls(stack, books, placer, lock, host)
        placer.settlers[host] = demoter.signal
        return demoter

    def signal(self) -> None:
        """The tier may be past its high watermark: settle it soon."""
        with self._idle:
            self._busy = True
        self._wake.set()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no settling is asked for or running; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._busy, timeout)

    def close(self) -> None:
        """Stop after the batch in flight (the store's spill copies what is left)."""
        self._stopped = True
        self._wake.set()
        self._thread.join()

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                break
            try:
                while not self._stopped and self.step():
                    pass
            except Exception:  # the request path still makes room when a write must have it
                log.exception("background demotion from the %s tier failed",
                              self._stack.names[self.pos])
            with self._idle:
                if not self._wake.is_set():
                    self._busy = False
                    self._idle.notify_all()
        with self._idle:
            self._busy = False
            self._idle.notify_all()

    def step(self) -> bool:
        """Move one batch down; False once the tier is settled or nothing more can move."""
        batch = self._pick()
        if not batch:
            return batch is not None  # [] : blocks left without a copy to write; go on
        batch = self._verified(batch)
        if not batch:
            return True
        items = self._sealed(batch)
        try:
            self._tiers[self.low].put_many(items)
        except (CapacityError, TierUnavailableError) as exc:
            log.warning("background demotion: the %s tier refused %d blocks: %s",
                        self._stack.names[self.low], len(items), exc)
            with self._lock:
                self._ledger.unwatch(item[0] for item, _ in batch)
            return False
        except BaseException:
            with self._lock:
                self._ledger.unwatch(item[0] for item, _ in batch)
            raise
        self._record(batch, items)
        return True

    # -- under the lock -----------------------------------------------------------------------
    def _pick(self) -> Batch | None:
        """The next batch, with its bytes copied out of the slab (whose slots may be reused
        once the lock is let go); None when there is nothing to do."""
        pos, tier = self.pos, self._tiers[self.pos]
        with self._lock:
            if not self._placer.over_high_watermark(pos):
                return None
            goal = tier.used_bytes() - int(self._stack.configs[pos].low_watermark
                                           * tier.capacity_bytes)
            resident = self._ledger.resident(pos)
            each = max(1.0, tier.used_bytes() / resident) if resident else 1.0
            want = min(MAX_DEMOTE_BATCH, max(1, math.ceil(goal / each)))
            victims = self._ledger.victims(pos, want, self._leases.evictable)
            if not victims:
                return None
            admit = self._stack.admissions[self.low].admit
            move: list[tuple[BlockKey, Entry]] = []
            other: list[BlockKey] = []
            for key in victims:
                entry = self._ledger.get(key)
                if entry is not None and not entry.tiers >> self.low and admit(key):
                    move.append((key, entry))
                else:  # a copy below already, or none may have one: nothing to write
                    other.append(key)
            if other:
                self._placer.demote(pos, other)
            elif not move:
                return None
            datas = tier.get_many([key for key, _ in move])
            batch: Batch = [((key, data, BlockMeta(e.layout_id, e.checksum, e.size)), e)
                            for (key, e), data in zip(move, datas, strict=True)
                            if data is not None]
            need = sum(self._tiers[self.low].charge(e.size) for _, e in batch)
            if batch and not self._placer.make_room(self.low, need):
                return None
            self._ledger.watch(item[0] for item, _ in batch)
            return batch

    def _record(self, batch: Batch, items: list[Item]) -> None:
        """The batch is below: record the copies, then free the slots of the blocks still
        evictable; undo the copies of blocks that left meanwhile."""
        pos, low = self.pos, self.low
        with self._lock:
            moved: list[BlockKey] = []
            stale: list[BlockKey] = []
            fate = self._ledger.unwatch(item[0] for item, _ in batch)
            for ((key, _, _), picked), (_, _, meta) in zip(batch, items, strict=True):
                if fate[key] == GONE:  # deleted meanwhile: the copy just written is its only one
                    stale.append(key)
                    continue
                entry = self._ledger.get(key)
                if entry is not picked or entry.pending:  # deleted (or replaced) meanwhile
                    if entry is None or entry.pending or not entry.holds(low):
                        stale.append(key)
                    continue
                if entry.holds(low):  # the request path copied it down meanwhile
                    continue
                if entry.checksum is None:
                    entry.checksum = meta.checksum
                self._ledger.add_copy(low, key, entry)
                self._tally.demoted(pos, key[0])
                if entry.holds(pos) and self._leases.evictable(key):
                    moved.append(key)
            if stale:
                self._tiers[low].delete(stale)
            if moved:
                self._tally.evicted(pos, len(moved))
                self._exits.remove(pos, moved)
            self._placer.settle(low)

    # -- without the lock ---------------------------------------------------------------------
    def _verified(self, batch: Batch) -> Batch:
        """The blocks of ``batch`` whose bytes (copied out of the slab when picked) match
        their recorded checksum, one batched hash call; the others never go down: they are
        dropped from the store, counted with cause ``demote``."""
        todo = [i for i, ((_, _, meta), _) in enumerate(batch) if meta.checksum is not None]
        sums = checksums([batch[i][0][1] for i in todo])
        bad = {batch[i][0][0] for i, csum in zip(todo, sums, strict=True)
               if csum != batch[i][0][2].checksum}
        if not bad:
            return batch
        picked = {key: entry for (key, _, _), entry in batch if key in bad}
        with self._lock:  # only the block that was read: not one deleted and put again since
            fate = self._ledger.unwatch(bad)
            self._checks.drop(self.pos, [k for k in bad if fate[k] == KEPT
                                         and self._ledger.get(k) is picked[k]], "demote")
        return [b for b in batch if b[0][0] not in bad]

    @staticmethod
    def _sealed(batch: Batch) -> list[Item]:
        """The batch's items, each with its checksum (computed here for memory-only blocks)."""
        out: list[Item] = []
        for (key, data, meta), _ in batch:
            if meta.checksum is None:
                meta = meta._replace(checksum=checksum(data))
            out.append((key, data, meta))
        return out
