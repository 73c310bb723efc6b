"""What one node holds in S3: its live blocks, where each one's bytes are, and the group
objects they live in, with the byte accounting and the rule for deleting a group.

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

Memory: a live block costs one dict entry (key -> its group's record) plus two list slots in
the record (its key and meta); a location is computed when asked for, not stored per block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3.layout import Where
from kvstore.types import BlockKey


class Held(NamedTuple):
    meta: BlockMeta
    where: Where


@dataclass(slots=True)
class GroupRecord:
    """The members of group object ``name`` that this node knows, by position (None: a
    position it does not know), and which are live (a bit mask)."""

    name: BlockKey
    keys: list[BlockKey | None] = field(default_factory=list)
    metas: list[BlockMeta | None] = field(default_factory=list)
    alive: int = 0  # bit i set: member i is live
    dead_size: int = 0  # bytes of known dead members

    def pos(self, key: BlockKey, *, live: bool) -> int:
        """The position of ``key`` (live or dead as asked), or -1."""
        for i, k in enumerate(self.keys):
            if k == key and bool(self.alive >> i & 1) == live:
                return i
        return -1

    def names(self) -> list[BlockKey]:
        """The keys of the group object and of its known members' pointers."""
        return [self.name, *(k for k in self.keys[1:] if k is not None)]


class Holdings:
    """Live blocks and their group records. Not thread-safe: the tier calls it under its
    lock (:meth:`find`, :meth:`get` and ``in`` are safe without it)."""

    def __init__(self) -> None:
        self._live: dict[BlockKey, GroupRecord] = {}
        self._groups: dict[BlockKey, GroupRecord] = {}
        self._dead: dict[BlockKey, GroupRecord] = {}  # dead member -> its group, for revival
        self.used = 0
        self.dead_bytes = 0

    def find(self, key: BlockKey) -> Held | None:
        """Meta and location of a live block."""
        record = self._live.get(key)
        if record is None:
            return None
        pos = record.pos(key, live=True)
        meta = record.metas[pos] if pos >= 0 else None
        return Held(meta, Where(record.name, pos)) if meta is not None else None

    def get(self, key: BlockKey) -> BlockMeta | None:
        held = self.find(key)
        return held.meta if held is not None else None

    def where(self, key: BlockKey) -> Where | None:
        held = self.find(key)
        return held.where if held is not None else None

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._live)

    @property
    def objects(self) -> int:
        """Group objects (single blocks included) holding at least one live block."""
        return len(self._groups)

    def names_group(self, name: BlockKey) -> bool:
        """Whether ``name`` is the name of a group object holding a live block."""
        return name in self._groups

    def group_of(self, key: BlockKey) -> BlockKey | None:
        """The name of the object holding live block ``key``."""
        record = self._live.get(key)
        return record.name if record is not None else None

    def live_members(self, group: BlockKey) -> list[tuple[int, BlockKey, BlockMeta]]:
        """``(position, key, meta)`` of each live member of object ``group``."""
        record = self._groups.get(group)
        if record is None:
            return []
        return [(pos, key, meta) for pos, (key, meta) in enumerate(zip(record.keys,
                                                                      record.metas, strict=True))
                if key is not None and meta is not None and record.alive >> pos & 1]

    def dead_share(self, group: BlockKey) -> float:
        """The part of object ``group``'s known bytes that dead members take (0 if unknown)."""
        record = self._groups.get(group)
        if record is None or not record.dead_size:
            return 0.0
        live = sum(meta.size for _, _, meta in self.live_members(group))
        return record.dead_size / (record.dead_size + live)

    def in_use(self, name: BlockKey) -> bool:
        """Whether an object named ``name`` serves a live block of this node (a group it
        reads from, or a live block's own group object or pointer): never delete it."""
        return name in self._live or name in self._groups

    # -- changes ----------------------------------------------------------------------------
    def hold(self, key: BlockKey, meta: BlockMeta, where: Where) -> list[BlockKey]:
        """Count ``key`` live at ``where`` (forgetting an older copy of it first). Returns the
        names of objects that died because of the older copy (for the caller to delete)."""
        dead = self.forget(key)
        record = self._groups.get(where.group)
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
                self.dead_bytes -= size
                self._dead.pop(key, None)
        if record is None:
            record = self._groups[where.group] = GroupRecord(where.group)
        if pos >= len(record.keys):
            grow = pos + 1 - len(record.keys)
            record.keys += [None] * grow
            record.metas += [None] * grow
        record.keys[pos] = key
        record.metas[pos] = meta
        record.alive |= 1 << pos
        self._live[key] = record
        self.used += meta.size
        return dead

    def revivable(self, key: BlockKey, meta: BlockMeta) -> Where | None:
        """Where ``key`` is stored as a dead member with this meta, if it is."""
        record = self._dead.get(key)
        if record is None or self._groups.get(record.name) is not record:
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
        record = self._live.pop(key, None)
        if record is None:
            return []
        pos = record.pos(key, live=True)
        meta = record.metas[pos]
        size = meta.size if meta is not None else 0
        self.used -= size
        record.alive &= ~(1 << pos)
        if record.alive:
            record.dead_size += size
            self.dead_bytes += size
            self._dead[key] = record
            return []
        self._drop_record(record)
        return record.names()

    def lose(self, group: BlockKey) -> list[BlockKey]:
        """Forget a group object that is gone or replaced (never delete it: it may be
        another node's now). Returns the live keys forgotten with it."""
        record = self._groups.get(group)
        if record is None:
            return []
        lost: list[BlockKey] = []
        for pos, (key, meta) in enumerate(zip(record.keys, record.metas, strict=True)):
            if key is not None and meta is not None and record.alive >> pos & 1:
                del self._live[key]
                self.used -= meta.size
                lost.append(key)
        self._drop_record(record)
        return lost

    def _drop_record(self, record: GroupRecord) -> None:
        del self._groups[record.name]
        self.dead_bytes -= record.dead_size
        for key in record.keys:
            if key is not None and self._dead.get(key) is record:
                del self._dead[key]
