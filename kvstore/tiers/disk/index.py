"""The disk tier's file as an index: what the store asks LMDB instead of keeping a map of every
block in RAM (contains, metas, the stored run of a hash chain, a namespace's keys, random
samples for eviction).

Each function runs inside one read transaction the caller opens (:class:`~kvstore.tiers.disk
.DiskTier` opens it under its remap gate) and reads only keys and the 64-byte headers: a
block's payload is never touched. A value that is not ours (bad header) counts as absent.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import lmdb

from kvstore.tiers.base import BlockMeta
from kvstore.tiers.disk.damage import DAMAGE_ERRORS, PageDamage, values
from kvstore.tiers.disk.records import MAGIC, decode_key, payload_size, unpack_headers
from kvstore.tiers.lmdb_keys import keys_with, sample_keys
from kvstore.types import BlockKey


def metas(txn: lmdb.Transaction, raws: list[bytes]) -> tuple[list[BlockMeta | None], list[int]]:
    """The meta of each of ``raws`` (None: absent, or not ours) and the indices of the
    values present but not ours (a bad header). :class:`PageDamage` names a key LMDB fails
    on."""
    found = values(txn, raws)
    out = unpack_headers(found)
    if None not in out:  # the common batch: no Python step per key
        return out, []
    return out, [i for i, (meta, value) in enumerate(zip(out, found, strict=True))
                 if meta is None and value is not None]


def leading(txn: lmdb.Transaction, prefix: bytes, hashes: Sequence[bytes],
            damaged: frozenset[bytes]) -> int:
    """How many of ``hashes``, from the first, are stored (a chain's stored run), a key in
    ``damaged`` ending it. Only the magic of each header is checked (a lookup's hot loop:
    half the cost of the whole header); a value that is ours but damaged further in reads as
    a miss when it is got. :class:`PageDamage` names a key LMDB fails on."""
    n = 0
    get = txn.get
    for h in hashes:
        raw = prefix + h
        if damaged and raw in damaged:  # before the get: LMDB would fail on it again
            break
        try:
            value = get(raw)
        except DAMAGE_ERRORS as exc:
            raise PageDamage(raw, exc) from exc
        if value is None or value[:4] != MAGIC:
            break
        n += 1
    return n


def keys_from(txn: lmdb.Transaction, prefix: bytes, out: list[bytes], backward: bool) -> None:
    """Append to ``out`` every encoded key starting with ``prefix`` whose value is ours, in
    key order, or from the last backwards. LMDB's error at a damaged page passes (a cursor
    reads each value it steps on), and ``out`` keeps the keys read before it."""
    if not backward:
        out.extend(raw for raw, value in keys_with(txn, prefix)
                   if payload_size(value) is not None)
        return
    cur = txn.cursor()
    end = prefix[:-1] + bytes([prefix[-1] + 1])  # the first key past the prefix's range
    if not (cur.prev() if cur.set_range(end) else cur.last()):
        return
    for raw, value in cur.iterprev():
        raw = bytes(raw)
        if not raw.startswith(prefix):
            return
        if payload_size(value) is not None:
            out.append(raw)


def sample(txn: lmdb.Transaction, weights: dict[str, int], n: int,
           rng: random.Random) -> list[BlockKey]:
    """About ``n`` stored keys at random (:func:`~kvstore.tiers.lmdb_keys.sample_keys`)."""
    return sample_keys(txn, weights, n, rng, lambda ns: ns.encode() + b"\x00", decode_key,
                       lambda value: payload_size(value) is not None)
