"""Demotion off the request path: a thread settles the host tier from its high watermark down
to its low one by moving its coldest blocks to the persistent tier below, a batch at a time,
holding the store lock only to pick a batch, to copy its bytes out of the slab (a run of a few
MiB per hold, so that a read beside it waits for one run, not the batch) and to record the
result. Each block's bytes are checked against its recorded checksum right after its run is
copied, before they go down. The write below (one LMDB transaction, and its fsync, per batch)
runs without it, so reads and puts beside a demoting put no longer wait for the disk; a write
that would not fit meanwhile waits for the batch to land (:meth:`Demoter.wait_room`) rather
than evict under the lock itself.

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
import time
from collections.abc import Iterator

from kvstore.checksum import checksums
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
Picked = list[tuple[BlockKey, Entry]]
COPY_RUN_BYTES = 2 << 20  # copied out of the slab per hold of the store lock
ROOM_WAIT_S = 2.0  # a write waits for a batch in flight this long at most, then makes room


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
        self._since: float | None = None  # when the batch in flight was picked
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

    def wait_room(self, need: int) -> bool:
        """Wait, without the store lock, while settling runs and ``need`` more bytes do not fit
        in the tier yet: each batch recorded below frees room. True once they fit (or no
        settling runs: the caller then makes room itself); False once the batch in flight has
        taken ``ROOM_WAIT_S`` (a slow or stuck disk: the caller evicts itself, as before). A
        write that waits here instead of evicting under the store lock leaves the reads beside
        it free, and does not write again the blocks that the batch in flight is writing."""
        with self._idle:
            while self._busy and not self._placer.fits_now(self.pos, need):
                since = self._since
                left = ROOM_WAIT_S if since is None else since + ROOM_WAIT_S - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

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
        move = self._pick()
        if move is None:
            return False
        with self._idle:
            self._since = time.monotonic()
        try:
            # [] : the victims had a copy below already (or may have none): room made; go on
            return self._move(move) if move else True
        finally:
            with self._idle:  # room freed (or not: the writers waiting stop waiting)
                self._since = None
                self._idle.notify_all()

    def _move(self, move: Picked) -> bool:
        """Copy the picked blocks down and record them; False if the tier below refused."""
        try:
            batch = self._copied(move)
        except BaseException:
            with self._lock:
                self._ledger.unwatch(key for key, _ in move)
            raise
        if not batch:
            return True
        items = [item for item, _ in batch]
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
    def _pick(self) -> Picked | None:
        """The next batch's blocks, watched, with room made for them below; None when there
        is nothing to do."""
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
            move: Picked = []
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
            need = sum(self._tiers[self.low].charge(e.size) for _, e in move)
            if move and not self._placer.make_room(self.low, need):
                return None
            self._ledger.watch(key for key, _ in move)
            return move

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

    # -- runs under the lock, the rest without it -------------------------------------------
    def _copied(self, move: Picked) -> Batch:
        """The picked blocks with their bytes, copied out of the slab (whose slots may be
        reused once the lock is let go) a run of ``COPY_RUN_BYTES`` at a time, each run under
        the lock: a call beside it waits for one run, not for the whole batch. Each run is
        checked against its recorded checksums right after, without the lock, while still in
        cache (a block without one gets it here). A block deleted, replaced or moved out of
        the tier between runs is left out; one whose bytes do not match never goes down: it
        is dropped from the store, counted with cause ``demote``."""
        pos, tier = self.pos, self._tiers[self.pos]
        batch: Batch = []
        bad: dict[BlockKey, Entry] = {}
        for run in _runs(move, COPY_RUN_BYTES):
            with self._lock:
                live = [(k, e) for k, e in run if self._ledger.get(k) is e and e.holds(pos)]
                datas = tier.get_many([k for k, _ in live])
                got = [(k, e, d) for (k, e), d in zip(live, datas, strict=True) if d is not None]
                if len(got) < len(run):
                    kept = {k for k, _, _ in got}
                    self._ledger.unwatch(k for k, _ in run if k not in kept)
            for (key, e, data), csum in zip(got, checksums([d for _, _, d in got]),
                                            strict=True):
                if e.checksum is not None and csum != e.checksum:
                    bad[key] = e
                else:
                    batch.append(((key, data, BlockMeta(e.layout_id, csum, e.size)), e))
        if bad:
            with self._lock:  # only the block that was read: not one deleted and put again since
                fate = self._ledger.unwatch(bad)
                self._checks.drop(pos, [k for k, e in bad.items() if fate[k] == KEPT
                                        and self._ledger.get(k) is e], "demote")
        return batch


def _runs(move: Picked, nbytes: int) -> Iterator[Picked]:
    """``move`` cut into runs of about ``nbytes`` (at least one block each)."""
    run: Picked = []
    size = 0
    for key, entry in move:
        run.append((key, entry))
        size += entry.size
        if size >= nbytes:
            yield run
            run, size = [], 0
    if run:
        yield run
