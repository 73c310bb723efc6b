"""How the S3 catalog's LMDB records are encoded: keys by kind, a live block's meta and place,
a group object's members, the count records.

Keys start with one kind byte, then ``namespace NUL hash`` (a namespace never holds NUL):

- ``L`` a live block: its meta and where its bytes are (position, and the hash of the group
  object it is in: a group holds blocks of one namespace);
- ``G`` a group object holding a live block: a bit mask of its live members, the bytes of
  its known dead members, and each member it knows by position (hash and meta, or unknown);
- ``D`` a dead member that may be revived: the hash of the group that still stores it;
- ``N`` + namespace: the namespace's live blocks and bytes; ``T``: the totals (used bytes,
  dead bytes, group objects); ``I``: what the catalog is of (format, endpoint, bucket, prefix).

Sorted by kind first, the live blocks of one namespace are one contiguous key range: the
index reads (``catalog_index``) seek in it as the disk tier seeks in its file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from kvstore.tiers.base import BlockMeta
from kvstore.types import BlockKey

LIVE, GROUP, DEAD, NS_COUNT = b"L", b"G", b"D", b"N"
TOTALS, IDENTITY = b"T", b"I"
FORMAT = 1  # bump when an encoding changes: an older catalog is then started afresh

_META = struct.Struct("<QQQB")  # layout id, checksum, size, has checksum
_GROUP = struct.Struct("<QqB")  # live bit mask, dead bytes, members
_COUNT = struct.Struct("<qq")
_TOTALS = struct.Struct("<qqq")


class Live(NamedTuple):
    """A live block's record: its meta, its group's hash, its position there."""

    meta: BlockMeta
    group: bytes
    pos: int


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


def block_key(kind: bytes, key: BlockKey) -> bytes:
    return kind + key[0].encode() + b"\x00" + key[1]


def ns_prefix(kind: bytes, namespace: str) -> bytes:
    return kind + namespace.encode() + b"\x00"


def decode_key(raw: bytes) -> BlockKey:
    ns, _, h = raw[1:].partition(b"\x00")
    return ns.decode(), h


def _meta(meta: BlockMeta) -> bytes:
    csum = meta.checksum
    return _META.pack(meta.layout_id, csum or 0, meta.size, csum is not None)


def _unmeta(raw: bytes, at: int = 0) -> BlockMeta:
    layout, csum, size, has = _META.unpack_from(raw, at)
    return BlockMeta(layout, csum if has else None, size)


def pack_live(meta: BlockMeta, group: bytes, pos: int) -> bytes:
    return _meta(meta) + bytes((pos,)) + group


def unpack_live(raw: bytes) -> Live:
    return Live(_unmeta(raw), bytes(raw[_META.size + 1 :]), raw[_META.size])


def live_meta(raw: bytes) -> BlockMeta:
    return _unmeta(raw)


def pack_group(record: GroupRecord) -> bytes:
    parts = [_GROUP.pack(record.alive, record.dead_size, len(record.keys))]
    for key, meta in zip(record.keys, record.metas, strict=True):
        if key is None or meta is None:
            parts.append(b"\xff")
        else:
            parts += [bytes((len(key[1]),)), key[1], _meta(meta)]
    return b"".join(parts)


def unpack_group(name: BlockKey, raw: bytes) -> GroupRecord:
    alive, dead_size, n = _GROUP.unpack_from(raw)
    record = GroupRecord(name, alive=alive, dead_size=dead_size)
    at = _GROUP.size
    for _ in range(n):
        length = raw[at]
        at += 1
        if length == 0xFF:
            record.keys.append(None)
            record.metas.append(None)
            continue
        record.keys.append((name[0], bytes(raw[at : at + length])))
        record.metas.append(_unmeta(raw, at + length))
        at += length + _META.size
    return record


def pack_count(blocks: int, nbytes: int) -> bytes:
    return _COUNT.pack(blocks, nbytes)


def unpack_count(raw: bytes) -> tuple[int, int]:
    blocks, nbytes = _COUNT.unpack(raw)
    return blocks, nbytes


def pack_totals(used: int, dead_bytes: int, objects: int) -> bytes:
    return _TOTALS.pack(used, dead_bytes, objects)


def unpack_totals(raw: bytes) -> tuple[int, int, int]:
    used, dead, objects = _TOTALS.unpack(raw)
    return used, dead, objects
