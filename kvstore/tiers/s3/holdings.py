"""What one node holds in S3: its live blocks, where each one's bytes are, and the group
objects they live in, with the byte accounting and the rule for deleting a group, kept in a
local LMDB catalog (``catalog``) rather than in Python objects.

A block is **live** while this node counts it as held (written, scanned or discovered, and not
deleted since). Its bytes are member ``index`` of a group object (``layout.Where``; a single
block is a group of one). Deleting a live block makes it a **dead member**: its bytes stay in
the group object, which is deleted (with the pointers of its members) only when the last member
this node knows of it dies. Until then a dead member put again with the same meta is
**revived** in place, without an upload.

Accounting: ``used`` counts live blocks only (so evicting a block frees its bytes, as in every
tier); ``dead_bytes`` counts the dead members still stored because a live member shares their
object, so this node's footprint in the bucket is ``used + dead_bytes``. The writer rewrites a
group whose dead share passes a bound (compaction, ``writer``), which bounds that footprint.

Memory: RAM holds the totals and one count per namespace; every block's record is in the
catalog file (a live record, and its place in its group's record). With a catalog ``path``, a
restart keeps what the node held. Blocks that left without the store asking (a group found gone
or replaced, an upload dropped) and blocks adopted by discovery are noted as **changes** for
the store to account for (:meth:`Holdings.changes`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import lmdb

from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3 import catalog_index
from kvstore.tiers.s3.catalog import CatalogFile
from kvstore.tiers.s3.catalog_counts import CatalogCounts, CatalogLock
from kvstore.tiers.s3.catalog_records import (
    DEAD,
    FORMAT,
    GROUP,
    LIVE,
    GroupRecord,
    Live,
    block_key,
    ns_prefix,
    pack_group,
    pack_live,
    unpack_group,
    unpack_live,
)
from kvstore.tiers.s3.client import DEFAULT_CATALOG_MAP_SIZE
from kvstore.tiers.s3.layout import Where
from kvstore.types import BlockKey

__all__ = ["GroupRecord", "Held", "Holdings"]
_GET, _PUT, _DELETE = lmdb.Transaction.get, lmdb.Transaction.put, lmdb.Transaction.delete
_CHANGES_MAX = 1 << 20  # changes kept for the store; only a tier without a store gets there


class Held(NamedTuple):
    meta: BlockMeta
    where: Where


class Holdings:
    """Live blocks and their group records, in the catalog at ``path`` (None: a temporary
    one). Call changes under :attr:`lock` (:meth:`find`, :meth:`get`, ``in`` and the index
    reads are safe without it; outside it every change commits at once)."""

    def __init__(self, path: str | None = None, map_size: int = DEFAULT_CATALOG_MAP_SIZE,
                 identity: str = "") -> None:
        self.file = CatalogFile(path, map_size)
        self.counts = CatalogCounts(self.file, f"{FORMAT}|{identity}".encode())
        self.lock = CatalogLock(self.file, self.counts)
        self._changes: dict[BlockKey, tuple[BlockMeta, bool]] = {}

    # -- reading ------------------------------------------------------------------------------
    def _live(self, key: BlockKey) -> Live | None:
        raw = self.file.read(_GET, block_key(LIVE, key))
        return None if raw is None else unpack_live(raw)

    def _group(self, name: BlockKey) -> GroupRecord | None:
        raw = self.file.read(_GET, block_key(GROUP, name))
        return None if raw is None else unpack_group(name, raw)

    def find(self, key: BlockKey) -> Held | None:
        """Meta and location of a live block."""
        live = self._live(key)
        return None if live is None else Held(live.meta, Where((key[0], live.group), live.pos))

    def find_many(self, keys: Sequence[BlockKey]) -> list[Held | None]:
        """:meth:`find` of each key, in one read transaction."""
        lives = self.file.read(_lives, [block_key(LIVE, k) for k in keys])
        return [None if live is None else Held(live.meta, Where((key[0], live.group), live.pos))
                for key, live in zip(keys, lives, strict=True)]

    def get(self, key: BlockKey) -> BlockMeta | None:
        live = self._live(key)
        return live.meta if live is not None else None

    def where(self, key: BlockKey) -> Where | None:
        held = self.find(key)
        return held.where if held is not None else None

    def __contains__(self, key: object) -> bool:
        return (isinstance(key, tuple) and len(key) == 2
                and self.file.read(_GET, block_key(LIVE, key)) is not None)

    def __len__(self) -> int:
        return self.counts.blocks

    @property
    def used(self) -> int:
        """Bytes of the live blocks."""
        return self.counts.used

    @property
    def dead_bytes(self) -> int:
        """Bytes of the dead members still stored beside live ones."""
        return self.counts.dead_bytes

    @property
    def objects(self) -> int:
        """Group objects (single blocks included) holding at least one live block."""
        return self.counts.objects

    def names_group(self, name: BlockKey) -> bool:
        """Whether ``name`` is the name of a group object holding a live block."""
        return self.file.read(_GET, block_key(GROUP, name)) is not None

    def group_of(self, key: BlockKey) -> BlockKey | None:
        """The name of the object holding live block ``key``."""
        live = self._live(key)
        return (key[0], live.group) if live is not None else None

    def live_members(self, group: BlockKey) -> list[tuple[int, BlockKey, BlockMeta]]:
        """``(position, key, meta)`` of each live member of object ``group``."""
        record = self._group(group)
        return [] if record is None else _live_members(record)

    def dead_share(self, group: BlockKey) -> float:
        """The part of object ``group``'s known bytes that dead members take (0 if unknown)."""
        record = self._group(group)
        if record is None or not record.dead_size:
            return 0.0
        live = sum(meta.size for _, _, meta in _live_members(record))
        return record.dead_size / (record.dead_size + live)

    def in_use(self, name: BlockKey) -> bool:
        """Whether an object named ``name`` serves a live block of this node (a group it
        reads from, or a live block's own group object or pointer): never delete it."""
        return name in self or self.names_group(name)

    # -- the store's index ----------------------------------------------------------------------
    def metas(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        return self.file.read(catalog_index.metas, [block_key(LIVE, k) for k in keys])

    def leading(self, namespace: str, hashes: Sequence[bytes]) -> int:
        return self.file.read(catalog_index.leading, ns_prefix(LIVE, namespace), hashes)

    def keys_of(self, namespace: str) -> list[BlockKey]:
        return self.file.read(catalog_index.namespace_keys, namespace)

    def namespace_usage(self) -> dict[str, tuple[int, int]]:
        return self.counts.usage()

    def sample(self, n: int, rng: random.Random) -> list[BlockKey]:
        weights = {ns: blocks for ns, (blocks, _) in self.counts.usage().items()}
        if n >= self.counts.blocks:
            return [k for ns in weights for k in self.keys_of(ns)]
        return self.file.read(catalog_index.sample, weights, n, rng)

    # -- changes ------------------------------------------------------------------------------
    def hold(self, key: BlockKey, meta: BlockMeta, where: Where) -> list[BlockKey]:
        """Count ``key`` live at ``where`` (forgetting an older copy of it first). Returns the
        names of objects that died because of the older copy (for the caller to delete)."""
        dead = self.forget(key)
        record = self._group(where.group)
        pos = where.pos
        if record is not None and pos < len(record.keys):
            there = record.keys[pos]
            if there is not None and there != key:
                self.lose(where.group)  # the object lists another block there: ours is stale
                record = None
            elif there == key:  # a dead member comes back
                old = record.metas[pos]
                size = old.size if old is not None else 0
                record.dead_size -= size
                self.counts.dead(-size)
                self.file.write(_DELETE, block_key(DEAD, key))
        if record is None:
            record = GroupRecord(where.group)
            self.counts.object(+1)
        if pos >= len(record.keys):
            grow = pos + 1 - len(record.keys)
            record.keys += [None] * grow
            record.metas += [None] * grow
        record.keys[pos] = key
        record.metas[pos] = meta
        record.alive |= 1 << pos
        self.file.write(_PUT, block_key(GROUP, where.group), pack_group(record))
        self.file.write(_PUT, block_key(LIVE, key), pack_live(meta, where.group[1], pos))
        self._count(key[0], meta.size, +1)
        return dead

    def revivable(self, key: BlockKey, meta: BlockMeta) -> Where | None:
        """Where ``key`` is stored as a dead member with this meta, if it is."""
        group = self.file.read(_GET, block_key(DEAD, key))
        record = None if group is None else self._group((key[0], group))
        if record is None:
            return None
        pos = record.pos(key, live=False)
        return Where(record.name, pos) if pos >= 0 and record.metas[pos] == meta else None

    def revive(self, key: BlockKey, meta: BlockMeta) -> bool:
        """Make a dead member live again if its object still holds it with this meta."""
        where = self.revivable(key, meta)
        if where is not None:
            self.hold(key, meta, where)
        return where is not None

    def forget(self, key: BlockKey) -> list[BlockKey]:
        """Count ``key`` dead. Returns the names to delete (the group object and its members'
        pointers) when that was the last live member of its group, else nothing."""
        live = self._live(key)
        if live is None:
            return []
        self.file.write(_DELETE, block_key(LIVE, key))
        size = live.meta.size
        self._count(key[0], size, -1)
        record = self._group((key[0], live.group))
        if record is None:  # cannot happen: a live block's group is recorded with it
            return []
        record.alive &= ~(1 << live.pos)
        if record.alive:
            record.dead_size += size
            self.counts.dead(size)
            self.file.write(_PUT, block_key(DEAD, key), live.group)
            self.file.write(_PUT, block_key(GROUP, record.name), pack_group(record))
            return []
        self._drop_record(record)
        return record.names()

    def lose(self, group: BlockKey) -> list[BlockKey]:
        """Forget a group object that is gone or replaced (never delete it: it may be
        another node's now). Returns the live keys forgotten with it (noted as changes)."""
        record = self._group(group)
        if record is None:
            return []
        lost: list[BlockKey] = []
        for _, key, meta in _live_members(record):
            self.file.write(_DELETE, block_key(LIVE, key))
            self._count(key[0], meta.size, -1)
            self._note(key, meta, adopted=False)
            lost.append(key)
        self._drop_record(record)
        return lost

    def _drop_record(self, record: GroupRecord) -> None:
        self.file.write(_DELETE, block_key(GROUP, record.name))
        self.counts.object(-1)
        self.counts.dead(-record.dead_size)
        for key in record.keys:
            if key is not None and self.file.read(_GET, block_key(DEAD, key)) == record.name[1]:
                self.file.write(_DELETE, block_key(DEAD, key))

    def _count(self, namespace: str, size: int, sign: int) -> None:
        self.counts.count(namespace, size, sign)
        if not self.file.holding():
            self.counts.save()

    # -- what the store accounts for --------------------------------------------------------
    def adopted(self, key: BlockKey, meta: BlockMeta) -> None:
        """Note a block that discovery made live (the store did not put it)."""
        self._note(key, meta, adopted=True)

    def _note(self, key: BlockKey, meta: BlockMeta, *, adopted: bool) -> None:
        """Net changes: a block adopted then lost before the store looked cancels out."""
        before = self._changes.get(key)
        if before is not None and before[1] != adopted:
            del self._changes[key]
        elif len(self._changes) < _CHANGES_MAX:
            self._changes[key] = (meta, adopted)

    def changes(self) -> list[tuple[BlockKey, BlockMeta, bool]]:
        """Blocks adopted (True) or lost (False) since the last call, and forget them."""
        out = [(key, meta, adopted) for key, (meta, adopted) in self._changes.items()]
        self._changes.clear()
        return out

    # -- the file -------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {"catalog_path": self.file.path if self.file.persistent else None,
                "catalog_bytes": self.file.size()}

    def close(self) -> None:
        self.file.close()


def _lives(txn: lmdb.Transaction, raws: list[bytes]) -> list[Live | None]:
    return [None if raw is None else unpack_live(cast(bytes, raw)) for raw in map(txn.get, raws)]


def _live_members(record: GroupRecord) -> list[tuple[int, BlockKey, BlockMeta]]:
    return [(pos, key, meta) for pos, (key, meta) in enumerate(zip(record.keys, record.metas,
                                                                  strict=True))
            if key is not None and meta is not None and record.alive >> pos & 1]

