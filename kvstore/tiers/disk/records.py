"""How the disk tier lays a block out in LMDB: the key (namespace, NUL, hash) and the value
(a fixed header, then the payload).

The header (:data:`HEADER`: magic, version, layout id, checksum, payload size) lets the tier
list every block's meta after a restart without a side table. A value whose magic is wrong is
not ours (or is damaged): reads treat it as absent and scans skip it.

Keys that start with NUL are the tier's own records (a namespace name never starts with NUL):
:data:`INDEX_MARK` says the file keeps its counts, and one :data:`COUNTS` record per namespace
holds its blocks and payload bytes, updated in the same transaction as the blocks. They let a
restart know what the file holds without reading every header.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.types import BlockKey

MAGIC = b"KVSB"
VERSION = 1
# magic, version u16, 2 pad, layout_id u64, checksum u64, size u32, 36 reserved (zero): 64
# bytes, so the payload starts at the same offset within a cache line as the value LMDB hands
# out. memcpy speed here depends on the source offset against the destination's, and the
# copy out of the map then matches a raw get of the whole value: at 64 KiB, 0.77-0.83 of raw
# py-lmdb against 0.65-0.72 with a 32-byte header (same run, same machine).
HEADER = struct.Struct("<4sHxxQQI36x")
# The header's fields a batched read checks: magic, version and pad as one u64, and the
# size (a nonzero pad sends the batch to the one-by-one check, which ignores the pad).
_CHECK = struct.Struct("<Q16xI")
_MAGIC_VERSION = _CHECK.unpack_from(HEADER.pack(MAGIC, VERSION, 0, 0, 0))[0]
BATCH_CHECK = 8  # values from which checking them all at once costs less than one by one


INDEX_MARK = b"\x00kvstore:index"
"""Present once the file's namespace counts are kept (absent: a file from before them)."""
COUNTS_PREFIX = b"\x00kvstore:ns:"
COUNTS = struct.Struct("<QQ")  # blocks, payload bytes


def counts_key(namespace: str) -> bytes:
    return COUNTS_PREFIX + namespace.encode()


def payload_size(value: Buffer | None) -> int | None:
    """The payload size of a stored value if it is one of ours with a valid header."""
    if value is None or len(value) < HEADER.size:
        return None
    magic, version, _layout, _checksum, size = HEADER.unpack_from(value)
    if magic != MAGIC or version != VERSION or HEADER.size + size != len(value):
        return None
    return int(size)


def payload_sizes(values: Iterable[Buffer | None]) -> list[int | None]:
    """:func:`payload_size` of each value."""
    return list(map(payload_size, values))


def encode_key(key: BlockKey) -> bytes:
    """``namespace + b"\\0" + hash`` (namespace names never contain NUL)."""
    return key[0].encode() + b"\x00" + key[1]


class KeyPrefixes(dict[str, bytes]):
    """``namespace -> namespace + NUL``, encoded on first use (a read batch then costs one
    concatenation per key). Cleared past :attr:`MAX` names, so any string asked about
    cannot grow it without bound."""

    MAX = 4096

    def __missing__(self, namespace: str) -> bytes:
        if len(self) >= self.MAX:
            self.clear()
        prefix = self[namespace] = namespace.encode() + b"\x00"
        return prefix


def decode_key(raw: bytes) -> BlockKey:
    ns, _, block_hash = raw.partition(b"\x00")  # the hash may contain NUL, the namespace not
    return ns.decode(), block_hash


def pack_value(data: Buffer, meta: BlockMeta) -> bytearray:
    """Header + payload in one buffer (the one copy a put makes before LMDB's own)."""
    view = memoryview(data).cast("B")
    value = bytearray(HEADER.size + view.nbytes)
    HEADER.pack_into(value, 0, MAGIC, VERSION, meta.layout_id, meta.checksum, view.nbytes)
    value[HEADER.size :] = view
    return value


def unpack_header(value: Buffer) -> BlockMeta | None:
    """The meta in a stored value's header, or None if it is not a valid kvstore header."""
    if len(value) < HEADER.size:
        return None
    magic, version, layout_id, checksum, size = HEADER.unpack_from(value)
    if magic != MAGIC or version != VERSION or HEADER.size + size != len(value):
        return None
    return BlockMeta(layout_id, checksum, size)


def unpack_headers(values: Iterable[Buffer | None]) -> list[BlockMeta | None]:
    """:func:`unpack_header` of each value (None, an absent value, stays None)."""
    return [None if v is None else unpack_header(v) for v in values]


def payloads(values: Sequence[Any]) -> tuple[list[bytes | None], list[int]]:
    """The payload of each stored value (memoryviews or None, what ``txn.get`` returns in a
    ``buffers=True`` transaction), copied out once (None: absent, or not ours), and the
    indices of the values present but not ours (a bad header)."""
    n = len(values)
    hs = HEADER.size
    if n >= BATCH_CHECK:
        try:
            lens = list(map(len, values))
            heads = list(map(_CHECK.unpack_from, values))
        except (TypeError, struct.error):  # a miss (None) or a short value: one at a time
            pass
        else:
            # The common batch, every value ours and of one size (one namespace's blocks),
            # is checked by two list comparisons in C instead of a Python step per header:
            # at 64 KiB each step shows against the copy itself.
            size = lens[0]
            if lens == [size] * n and heads == [(_MAGIC_VERSION, size - hs)] * n:
                return [v[hs:].tobytes() for v in values], []
    out: list[bytes | None] = []
    bad: list[int] = []
    unpack = HEADER.unpack_from
    for i, value in enumerate(values):
        if value is not None and len(value) >= hs:  # unpack_header() inlined: no BlockMeta
            magic, version, _layout, _checksum, size = unpack(value)
            if magic == MAGIC and version == VERSION and hs + size == len(value):
                out.append(value[hs:].tobytes())
                continue
        out.append(None)
        if value is not None:
            bad.append(i)
    return out, bad
