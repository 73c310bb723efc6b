"""Damage chosen pages of a closed LMDB file (the disk tier's ``data.mdb``), for tests and soak
runs: the page that holds one key's value, or the leaf page that holds a key.

The file is read as LMDB 0.9 lays it out on a 64-bit build: two meta pages (the one with the
larger transaction id is current; its main database's root page number at byte 128 of the
page, the page size at byte 40), then pages of ``psize`` bytes, each with a 16-byte header
(``pgno`` u64, pad u16, ``flags`` u16 at byte 10, lower/upper u16). Branch pages (flag 1) and
leaf pages (flag 2) hold node offsets after the header; a node is ``lo, hi, flags, ksize``
(u16 each), the key, then the data, or for a value too large for the leaf (node flag 1,
``F_BIGDATA``) the u64 number of its first overflow page. Flipping a page's flags makes
LMDB fail with ``MDB_CORRUPTED`` ("Located page was wrong type") on every key whose path or
value goes through that page, and on nothing else.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

_FLAGS_AT = 10
_BRANCH, _LEAF, _BIGDATA = 0x01, 0x02, 0x01


class Leaf(NamedTuple):
    """One leaf page: its number, and each key on it with its value's first overflow page
    (None: the value is inside the leaf)."""

    pgno: int
    keys: list[tuple[bytes, int | None]]


def _psize_and_root(raw: bytes | bytearray) -> tuple[int, int]:
    metas = []
    for at in (0, None):
        psize = struct.unpack_from("<I", raw, 40)[0]  # the first meta page gives the size
        base = 0 if at == 0 else psize
        txnid, root = struct.unpack_from("<Q", raw, base + 144)[0], struct.unpack_from(
            "<Q", raw, base + 128)[0]
        metas.append((txnid, root, psize))
    _, root, psize = max(metas)
    return psize, root


def _nodes(raw: bytes | bytearray, base: int,
           psize: int) -> list[tuple[int, int, int, int, int]]:
    """(offset, lo, hi, flags, ksize) of each node of the page at byte ``base`` (a damaged
    page's nodes may point anywhere: those outside the page are left out)."""
    lower = struct.unpack_from("<H", raw, base + 12)[0]
    out = []
    for i in range(max(0, min(lower, psize) - 16) // 2):
        off = base + struct.unpack_from("<H", raw, base + 16 + 2 * i)[0]
        if off + 8 <= base + psize:
            out.append((off, *struct.unpack_from("<HHHH", raw, off)))
    return out


def leaves(raw: bytes | bytearray) -> list[Leaf]:
    """Every leaf page of the main database, in key order (of a damaged file, those its
    branch pages still lead to)."""
    psize, root = _psize_and_root(raw)
    pages = len(raw) // psize
    out: list[Leaf] = []
    todo, seen = [root], set()
    while todo:
        pgno = todo.pop()
        if not 2 <= pgno < pages or pgno in seen:
            continue  # no tree (an empty file), or a damaged page number
        seen.add(pgno)
        base = pgno * psize
        flags = struct.unpack_from("<H", raw, base + _FLAGS_AT)[0]
        if flags & _BRANCH:  # a child's page number is split over lo, hi and flags
            todo.extend(reversed([lo | hi << 16 | fl << 32 for _, lo, hi, fl, _ in
                                  _nodes(raw, base, psize)]))
        elif flags & _LEAF:
            keys: list[tuple[bytes, int | None]] = []
            for off, _lo, _hi, fl, ks in _nodes(raw, base, psize):
                if off + 8 + ks + 8 > base + psize:
                    continue
                key = bytes(raw[off + 8: off + 8 + ks])
                big = struct.unpack_from("<Q", raw, off + 8 + ks)[0] if fl & _BIGDATA else None
                keys.append((key, big if big is None or 2 <= big < pages else None))
            out.append(Leaf(pgno, keys))
    return out


def _flip(data_mdb: Path, pgno: int) -> None:
    raw = bytearray(data_mdb.read_bytes())
    psize, _ = _psize_and_root(raw)
    raw[pgno * psize + _FLAGS_AT] ^= 0xFF
    data_mdb.write_bytes(raw)


def damage_value(data_mdb: Path, key: bytes) -> int:
    """Flip the flags of the first overflow page of ``key``'s value (a value over about a
    quarter page: kvstore blocks are) in the closed file ``data_mdb``: only that key fails.
    Returns the page number; raises ``KeyError`` if the key is absent or its value is in its
    leaf."""
    for leaf in leaves(data_mdb.read_bytes()):
        for stored, big in leaf.keys:
            if stored == key and big is not None:
                _flip(data_mdb, big)
                return big
    raise KeyError(f"{key!r} has no overflow page in {data_mdb}")


def damage_leaf(data_mdb: Path, key: bytes) -> list[bytes]:
    """Flip the flags of the leaf page that holds ``key`` in the closed file ``data_mdb``:
    every key on that page fails. Returns those keys; raises ``KeyError`` if it is absent."""
    for leaf in leaves(data_mdb.read_bytes()):
        if any(stored == key for stored, _ in leaf.keys):
            _flip(data_mdb, leaf.pgno)
            return [stored for stored, _ in leaf.keys]
    raise KeyError(f"{key!r} is not in {data_mdb}")
