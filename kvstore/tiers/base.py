"""The one interface every storage tier implements, and the two a tier may add.

:class:`IndexedTier` is a tier that is its own index (disk, S3); :class:`SharedTier` one that
other nodes write too (S3). The store tells them apart with ``isinstance``, never by probing
for a method.

Tiers store bytes under :data:`~kvstore.types.BlockKey` keys and account capacity in bytes.
They never decide what to evict (the store asks a policy) and never verify checksums (the
store does, with the checksum it keeps in its index and that persistent tiers keep beside the
bytes so the index can be rebuilt after a restart).

Thread-safety: the store calls a tier from several threads (request threads and the prefetch
worker) but never concurrently for the *same key*. Implementations guard their own shared
structures (free lists, open transactions).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from kvstore.types import BlockKey, Buffer, CorruptCause


class BlockMeta(NamedTuple):
    """What a tier keeps beside a block's bytes: the namespace layout id, the checksum of the
    bytes (xxh3-64) and their length. The checksum is None only on the way into a tier that
    neither keeps nor verifies it (memory tiers; see :attr:`Tier.needs_checksum`)."""

    layout_id: int
    checksum: int | None
    size: int


class Tier(ABC):
    """A storage tier with a byte capacity.

    ``name`` is the tier's kind as shown in stats and lookups: ``device``, ``host``, ``disk``,
    ``s3``. ``persistent`` tiers survive a restart: the store rebuilds its index from
    :meth:`scan`. ``verify_reads`` tells the store to check checksums on what this tier
    returns (memory tiers skip it; LMDB and S3 bytes can rot or be tampered with).
    """

    name: str = "tier"
    persistent: bool = False
    verify_reads: bool = False

    @property
    def needs_checksum(self) -> bool:
        """Whether blocks given to :meth:`put_many` must carry their checksum."""
        return self.persistent or self.verify_reads

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"{self.name} tier capacity must be positive, got {capacity_bytes}")
        self.capacity_bytes = int(capacity_bytes)

    # -- accounting ---------------------------------------------------------------------
    @abstractmethod
    def used_bytes(self) -> int:
        """Bytes charged against capacity right now (slot rounding included)."""

    def charge(self, size: int) -> int:
        """Bytes a block of ``size`` bytes would be charged. Slot tiers round up."""
        return size

    def charges(self, sizes: Sequence[int]) -> list[int]:
        """:meth:`charge` of each size."""
        return list(sizes)

    def fits(self, size: int) -> bool:
        """Whether a block of ``size`` bytes could ever fit in this tier."""
        return self.charge(size) <= self.capacity_bytes

    # -- data -----------------------------------------------------------------------------
    @abstractmethod
    def put_many(self, items: Sequence[tuple[BlockKey, Buffer, BlockMeta]]) -> None:
        """Store every item (overwriting an existing key). The caller guarantees room: after
        the call ``used_bytes() <= capacity_bytes`` must hold, else the tier raises
        :class:`~kvstore.errors.CapacityError` and stores none of the items. Raises
        :class:`~kvstore.errors.TierUnavailableError` if the back end cannot be written; then
        no item is visible. Buffers are only read during the call."""

    @abstractmethod
    def get_many(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        """The bytes of each key, or None where the tier does not hold it. The returned
        objects are owned by the caller (copies, not views into reusable memory)."""

    @abstractmethod
    def contains(self, key: BlockKey) -> bool:
        """Whether the tier holds ``key``."""

    @abstractmethod
    def delete(self, keys: Sequence[BlockKey]) -> None:
        """Remove the keys; absent keys are ignored."""

    def scan(self) -> Iterator[tuple[BlockKey, BlockMeta]]:
        """Every stored block with its meta. Persistent tiers implement it; the store calls it
        once at start to rebuild its index."""
        return iter(())

    def health(self) -> dict[str, Any]:
        """``{"ok": bool, ...}`` plus whatever helps an operator (errors, back end)."""
        return {"ok": True}

    def stats(self) -> dict[str, Any] | None:
        """The tier's own counters (S3: uploads pending, dropped, errors), shown under
        ``backend`` in the store's stats; None where it keeps none."""
        return None

    def check_integrity(self) -> None:  # noqa: B027 - optional hook
        """Raise ``RuntimeError`` if the tier's own bookkeeping disagrees with itself (slab
        tiers: every slot free or held exactly once); for tests and the store's own check."""

    def flush(self) -> None:  # noqa: B027 - optional hook
        """Make every completed put durable (persistent tiers)."""

    @abstractmethod
    def close(self) -> None:
        """Release resources. Persistent tiers flush first. Idempotent."""


@runtime_checkable
class FindsDamage(Protocol):
    """A tier that finds damaged blocks on its own, outside what the store verifies (the disk
    tier: keys on damaged LMDB pages, values with a bad header). It serves them as misses;
    the store takes them to drop the blocks and count them as corrupt."""

    # keys found damaged and not taken yet: the store tests it (a plain attribute, not a call)
    # before each read, and calls take_damaged only when it is not empty
    damage_pending: Mapping[bytes, str]

    def take_damaged(self) -> list[tuple[BlockKey, CorruptCause]]:
        """The keys found damaged since the last call, each with its cause (``disk_page``,
        ``disk_header``, ``disk_write``); each is returned once."""
        ...


class IndexedTier(Tier):
    """A tier that is its own index (the disk tier's LMDB file, the S3 tier's catalog): the
    store keeps no entry per block for it but asks it (:class:`~kvstore.store.cold.ColdIndex`),
    lists nothing from it at start, and its eviction policy draws victims from it
    (:meth:`sample`) instead of keeping a Python object per block."""

    @abstractmethod
    def metas(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        """The meta of each key, None where the tier does not hold it."""

    @abstractmethod
    def leading(self, namespace: str, hashes: Sequence[bytes]) -> int:
        """How many of ``hashes`` (a chain of ``namespace``), from the first, the tier holds."""

    @abstractmethod
    def keys_of(self, namespace: str) -> list[BlockKey]:
        """Every key of ``namespace`` the tier holds."""

    @abstractmethod
    def namespace_usage(self) -> dict[str, tuple[int, int]]:
        """``{namespace: (blocks, bytes)}`` of what the tier holds."""

    @abstractmethod
    def sample(self, n: int, rng: random.Random) -> list[BlockKey]:
        """``n`` keys the tier holds drawn at random (duplicates allowed), or every key when
        ``n >= len(self)``."""

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def __len__(self) -> int: ...


class SharedTier(Tier):
    """A tier other nodes write too (S3): blocks missing from this node's index are asked of
    it (:meth:`discover`), and what it learned other nodes added or removed is taken from it
    (:meth:`changes`)."""

    @abstractmethod
    def discover(self, keys: Sequence[BlockKey], *,
                 prefix: bool = False) -> list[BlockMeta | None]:
        """The meta of each key the tier holds (asking the back end where it must), None for
        the others; with ``prefix``, stop at the first key it does not hold."""

    @abstractmethod
    def changes(self) -> list[tuple[BlockKey, BlockMeta, bool]]:
        """Blocks found added (True) or gone (False) since the last call, each once."""
