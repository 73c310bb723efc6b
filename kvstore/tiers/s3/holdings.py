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
object, so this node's footprint in the bucket is ``used + dead_bytes``.
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
    """The members of one group object that this node knows, by index, and which are live."""

    slots: dict[int, tuple[BlockKey, BlockMeta]] = field(default_factory=dict)
    alive: set[int] = field(default_factory=set)
    dead_size: int = 0  # bytes of known dead members

    def names(self, group: BlockKey) -> list[BlockKey]:
        """The keys of the group object and of its known members' pointers."""
        return [group, *(k for i, (k, _) in sorted(self.slots.items()) if i)]


class Holdings:
    """Live blocks and their group records. Not thread-safe: the tier calls it under its
    lock (single-key reads such as ``get`` and ``in`` are safe without it)."""

    def __init__(self) -> None:
        self._live: dict[BlockKey, Held] = {}
        self._groups: dict[BlockKey, GroupRecord] = {}
        self._dead: dict[BlockKey, BlockKey] = {}  # dead member -> its group, for revival
        self.used = 0
        self.dead_bytes = 0

    def find(self, key: BlockKey) -> Held | None:
        """Meta and location of a live block, read together (safe without the lock)."""
        return self._live.get(key)

    def get(self, key: BlockKey) -> BlockMeta | None:
        held = self._live.get(key)
        return held.meta if held is not None else None

    def where(self, key: BlockKey) -> Where | None:
        held = self._live.get(key)
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
        slot = record.slots.get(where.pos) if record is not None else None
        if record is not None and slot is not None and slot[0] != key:
            self.lose(where.group)  # the object lists another block there: ours is stale
            record = None
        if record is None:
            record = self._groups[where.group] = GroupRecord()
        if slot is not None and slot[0] == key and where.pos not in record.alive:
            record.dead_size -= slot[1].size  # a dead member comes back
            self.dead_bytes -= slot[1].size
            self._dead.pop(key, None)
        record.slots[where.pos] = (key, meta)
        record.alive.add(where.pos)
        self._live[key] = Held(meta, where)
        self.used += meta.size
        return dead

    def revivable(self, key: BlockKey, meta: BlockMeta) -> Where | None:
        """Where ``key`` is stored as a dead member with this meta, if it is."""
        group = self._dead.get(key)
        record = self._groups.get(group) if group is not None else None
        if group is None or record is None:
            return None
        for index, (member, member_meta) in record.slots.items():
            if member == key and member_meta == meta and index not in record.alive:
                return Where(group, index)
        return None

    def revive(self, key: BlockKey, meta: BlockMeta) -> bool:
        """Make a dead member live again if its object still holds it with this meta."""
        where = self.revivable(key, meta)
        if where is not None:
            self.hold(key, meta, where)
        return where is not None

    def forget(self, key: BlockKey) -> list[BlockKey]:
        """Count ``key`` dead. Returns the names to delete (the group object and its members'
        pointers) when that was the last live member of its group, else nothing."""
        held = self._live.pop(key, None)
        if held is None:
            return []
        self.used -= held.meta.size
        group = held.where.group
        record = self._groups[group]
        record.alive.discard(held.where.pos)
        if record.alive:
            record.dead_size += held.meta.size
            self.dead_bytes += held.meta.size
            self._dead[key] = group
            return []
        self._drop_record(group, record)
        return record.names(group)

    def lose(self, group: BlockKey) -> list[BlockKey]:
        """Forget a group object that is gone or replaced (never delete it: it may be
        another node's now). Returns the live keys forgotten with it."""
        record = self._groups.get(group)
        if record is None:
            return []
        lost = [record.slots[i][0] for i in record.alive]
        for key in lost:
            held = self._live.pop(key)
            self.used -= held.meta.size
        self._drop_record(group, record)
        return lost

    def _drop_record(self, group: BlockKey, record: GroupRecord) -> None:
        del self._groups[group]
        self.dead_bytes -= record.dead_size
        for index, (member, _) in record.slots.items():
            if index not in record.alive and self._dead.get(member) == group:
                del self._dead[member]
