"""The store's index of the blocks in memory tiers: one entry per block, saying where it lives
and what it must hash to."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from kvstore.errors import InvalidHashError
from kvstore.types import BlockKey

MAX_HASH_BYTES = 64


@dataclass(slots=True, weakref_slot=True)
class Entry:
    """One block in the index.

    ``tiers`` is a bitmask of tier positions (bit 0 = top tier) that hold a complete, published
    copy. ``pending`` marks a shared-memory write reserved in the host tier but not yet
    committed: such a block is invisible to get, lookup and contains. ``checksum`` is None
    while only memory tiers hold the block: they never verify, so it is computed when the block
    first goes to a tier that keeps it (:meth:`~kvstore.store.placer.Placer.write`), not on the
    put path. Blocks that only the disk tier holds have no entry kept in RAM: the cold index
    (:mod:`kvstore.store.cold`) builds one from the tier's header when asked.
    """

    size: int
    checksum: int | None
    layout_id: int
    tiers: int = 0
    pending: bool = False

    def top(self) -> int:
        """Position of the highest tier holding the block (-1 if none)."""
        t = self.tiers
        return (t & -t).bit_length() - 1 if t else -1

    def holds(self, pos: int) -> bool:
        return bool(self.tiers >> pos & 1)

    def positions(self) -> list[int]:
        return [i for i in range(self.tiers.bit_length()) if self.tiers >> i & 1]


_EMPTY: dict[bytes, Entry] = {}


class BlockIndex:
    """``(namespace, hash) -> Entry``, stored as one dict per namespace so that a lookup of a
    long hash chain is a plain ``dict.get`` per hash, with no key tuple built."""

    __slots__ = ("_by_ns", "_len")

    def __init__(self) -> None:
        self._by_ns: dict[str, dict[bytes, Entry]] = {}
        self._len = 0

    def namespace(self, name: str) -> dict[bytes, Entry]:
        """The live map of one namespace (read-only for callers)."""
        return self._by_ns.get(name, _EMPTY)

    def get(self, key: BlockKey) -> Entry | None:
        return self._by_ns.get(key[0], _EMPTY).get(key[1])

    def get_many(self, keys: Iterable[BlockKey]) -> list[Entry | None]:
        """:meth:`get` of each key."""
        by_ns = self._by_ns
        return [by_ns.get(ns, _EMPTY).get(h) for ns, h in keys]

    def __getitem__(self, key: BlockKey) -> Entry:
        return self._by_ns[key[0]][key[1]]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        return key[1] in self._by_ns.get(key[0], _EMPTY)

    def __setitem__(self, key: BlockKey, entry: Entry) -> None:
        per = self._by_ns.setdefault(key[0], {})
        if key[1] not in per:
            self._len += 1
        per[key[1]] = entry

    def pop(self, key: BlockKey, default: Entry | None = None) -> Entry | None:
        per = self._by_ns.get(key[0])
        if per is None or key[1] not in per:
            return default
        self._len -= 1
        return per.pop(key[1])

    def set_many(self, pairs: Iterable[tuple[BlockKey, Entry]]) -> None:
        """``self[key] = entry`` for each pair, in order."""
        for key, entry in pairs:
            self[key] = entry

    def pop_many(self, keys: Iterable[BlockKey]) -> None:
        """:meth:`pop` of each key (absent keys are ignored)."""
        for key in keys:
            self.pop(key)

    def __delitem__(self, key: BlockKey) -> None:
        if self.pop(key) is None:
            raise KeyError(key)

    def items(self) -> Iterator[tuple[BlockKey, Entry]]:
        for ns, per in self._by_ns.items():
            for h, entry in per.items():
                yield (ns, h), entry

    def __len__(self) -> int:
        return self._len


def tops(entries: Iterable[Entry | None]) -> list[int]:
    """:meth:`Entry.top` of each entry (-1 for None or no tier)."""
    return [-1 if e is None or not e.tiers else (e.tiers & -e.tiers).bit_length() - 1
            for e in entries]


def make_entries(metas: Iterable[tuple[int, int | None, int]]) -> list[Entry]:
    """A new entry (in no tier yet) of each ``(layout_id, checksum, size)`` (a
    :class:`~kvstore.tiers.base.BlockMeta`)."""
    return [Entry(size, csum, layout) for layout, csum, size in metas]


def check_hashes(hashes: Sequence[bytes]) -> bool:
    """Validate a batch of hashes with C-level passes (no Python loop per hash). True if
    some are bytearrays (unhashable: the caller converts them)."""
    if not hashes:
        return False
    types = set(map(type, hashes))
    if not types <= {bytes, bytearray}:
        bad = next(h for h in hashes if not isinstance(h, bytes | bytearray))
        raise InvalidHashError(f"block hash must be bytes, got {type(bad).__name__}")
    lengths = set(map(len, hashes))
    if min(lengths) < 1 or max(lengths) > MAX_HASH_BYTES:
        raise InvalidHashError(f"block hash must be 1-{MAX_HASH_BYTES} bytes, got lengths "
                               f"{sorted(lengths)}")
    return bytearray in types


def make_keys(namespace: str, hashes: Sequence[bytes]) -> list[BlockKey]:
    """Validated index keys of ``hashes`` in ``namespace``."""
    check_hashes(hashes)
    return [(namespace, bytes(h)) for h in hashes]


def fmt_key(key: BlockKey) -> str:
    return f"{key[0]}/{key[1].hex()}"
