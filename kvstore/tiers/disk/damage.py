"""Damaged pages in the disk tier's LMDB file: which keys they cost, and what is reported.

A flipped bit in a page header or a node makes LMDB fail on the keys whose path goes through
that page (``MDB_CORRUPTED``, ``MDB_PAGE_NOTFOUND``, ``MDB_BAD_VALSIZE``), and it spoils the
whole transaction: every later call in it fails too. So the tier reads a batch in one
transaction and, when that fails for damage (:func:`values` names the key), again in a fresh
transaction without that key, which costs the batch only the keys on damaged pages.

LMDB can neither delete nor overwrite such a key (it must read the damaged page to do
either), so :class:`DamagedKeys` remembers up to :attr:`DamagedKeys.MAX` of them in memory:
they read as absent from then on without asking LMDB, and puts and deletes step over them.
The set is not kept in the file: after a restart a damaged key fails again at its first
read, is found again the same way (one extra transaction), and is counted and logged again
once. A value whose header is not a valid kvstore header (cause ``disk_header``) is counted
and logged once the same way.

The store takes what was found (:meth:`DamagedKeys.take`) to drop the block and count it as
corrupt with its cause; the tier's health shows :meth:`DamagedKeys.report`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import lmdb

from kvstore.errors import TierUnavailableError
from kvstore.tiers.base import Buffer

log = logging.getLogger("kvstore.tiers.disk")

T = TypeVar("T")

# What LMDB raises when a page it reads is not what the tree says it is: the file is damaged
# there (not full, not closed, not a bug of ours).
DAMAGE_ERRORS: tuple[type[lmdb.Error], ...] = (
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
    lmdb.BadValsizeError,
)

DamageCause = Literal["disk_page", "disk_write", "disk_header"]
"""``disk_page``: LMDB fails on the key's pages; ``disk_write``: the key reads, but LMDB
fails to write or delete it because a page that change must touch (a neighbour it would
merge with) is damaged; ``disk_header``: the value is there but its header is not a valid
kvstore header (damaged, or written by something else). The first two are remembered for
reads, puts and deletes to step over (a key that could not be deleted must not come back;
one that could not be overwritten must not serve its old bytes); a bad header costs nothing
to read again, and LMDB can overwrite or delete it. The store is given the first and the
last, the blocks it loses: a ``disk_write`` key was being deleted, or its put is found
lost at its next read."""
_FOR_STORE = ("disk_page", "disk_header")


class DiskPageError(TierUnavailableError):
    """LMDB failed on a damaged page of the file in a transaction that cannot tell which key
    it was for (a batch, or a commit); the tier isolates keys where it can."""


class PageDamage(Exception):
    """Raised out of a transaction body when LMDB fails on ``raw``'s pages: the transaction
    is spoiled and must end. Not an :class:`lmdb.Error`, so the environment lets it through
    untranslated and aborts the transaction."""

    def __init__(self, raw: bytes, error: lmdb.Error) -> None:
        super().__init__(f"{error} (key {raw!r})")
        self.raw = raw
        self.error = error


@dataclass(frozen=True, slots=True)
class DamageReport:
    """What a disk tier has found damaged since it opened (the ``damage`` of its health)."""

    found: int = 0  # keys found damaged (each counted once while remembered)
    by_cause: dict[str, int] = field(default_factory=dict)
    remembered: int = 0  # keys read as absent without asking LMDB now
    unkeyed_failures: int = 0  # commits and listings that failed on a damaged page
    last_error: str | None = None


class DamagedKeys:
    """The damaged keys of one file (bounded), the ones the store has not taken yet, and the
    counts for health. Thread-safe (reads find damage outside the tier's write lock)."""

    MAX = 4096  # keys remembered; past it the oldest is forgotten (then found again once)

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.bad: OrderedDict[bytes, DamageCause] = OrderedDict()
        # the keys of ``bad`` LMDB fails on: reads, puts and deletes step over them (plain
        # attributes, not calls: a batch tests them for nothing while no key is damaged)
        self.pages: frozenset[bytes] = frozenset()
        self.new: OrderedDict[bytes, DamageCause] = OrderedDict()  # not taken by the store yet
        self._causes: Counter[str] = Counter()
        self._unkeyed = 0
        self._last: str | None = None

    def repaired(self, raws: Iterable[bytes]) -> None:
        """``raws`` were written again: a bad header among them is gone (LMDB can overwrite
        a value whose header alone is damaged; one whose pages are damaged stays)."""
        if not self.bad:
            return
        with self._lock:
            for raw in raws:
                if self.bad.get(raw) == "disk_header":
                    del self.bad[raw]

    def note(self, raw: bytes, cause: DamageCause, error: str) -> bool:
        """``raw`` is damaged: remember it, count it and log it, once while remembered. True
        if it was not known."""
        with self._lock:
            if raw in self.bad:
                return False
            self.bad[raw] = cause
            if cause in _FOR_STORE:
                self.new[raw] = cause
            for book in (self.bad, self.new):
                while len(book) > self.MAX:
                    book.popitem(last=False)
            self.pages = frozenset(k for k, c in self.bad.items() if c != "disk_header")
            self._causes[cause] += 1
            self._last = f"{cause}: {error}"
        log.error("disk tier %s: key %r is damaged (%s): it reads as a miss from now on",
                  self.path, raw, error)
        return True

    def note_unkeyed(self, op: str, error: str) -> None:
        """A transaction (``op``: a commit, a listing) failed on a damaged page that no one
        key could be blamed for."""
        with self._lock:
            self._unkeyed += 1
            self._last = f"{op}: {error}"
        log.error("disk tier %s: %s failed on a damaged page: %s", self.path, op, error)

    def take(self) -> list[tuple[bytes, DamageCause]]:
        """The keys found damaged since the last call whose blocks are lost (``disk_page``,
        ``disk_header``), for the store to drop and count."""
        with self._lock:
            found = list(self.new.items())
            self.new.clear()
        return found

    def report(self) -> DamageReport:
        with self._lock:
            return DamageReport(found=sum(self._causes.values()), by_cause=dict(self._causes),
                                remembered=len(self.bad), unkeyed_failures=self._unkeyed,
                                last_error=self._last)


def values(txn: lmdb.Transaction, raws: Iterable[bytes]) -> list[Buffer | None]:
    """The value of each of ``raws`` (None: absent) in ``txn``; :class:`PageDamage` names the
    first key that LMDB fails on for damage."""
    out: list[Buffer | None] = []
    order = raws if isinstance(raws, list) else list(raws)
    try:
        out.extend(map(txn.get, order))  # C speed; what was read before a failure stays
    except DAMAGE_ERRORS as exc:
        raise PageDamage(order[len(out)], exc) from exc
    return out


def without(raws: Iterable[bytes], bad: AbstractSet[bytes]) -> list[bytes]:
    """``raws`` less the damaged keys ``bad``."""
    return [raw for raw in raws if raw not in bad]


def aligned(raws: list[bytes], todo: list[bytes], got: Sequence[T | None]) -> list[T | None]:
    """``got`` (one per key of ``todo``) spread over ``raws``: None for the keys left out."""
    found = dict(zip(todo, got, strict=True))
    return [found.get(raw) for raw in raws]


def less(batch: dict[bytes, T] | list[bytes],
          bad: frozenset[bytes] | set[bytes]) -> dict[bytes, T] | list[bytes]:
    """``batch`` (blocks by encoded key, or encoded keys) less the keys ``bad``."""
    if isinstance(batch, dict):
        return {raw: v for raw, v in batch.items() if raw not in bad}
    return without(batch, bad)
