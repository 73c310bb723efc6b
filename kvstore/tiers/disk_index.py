"""The disk tier's file as an index: what the store asks LMDB instead of keeping a map of every
block in RAM (contains, metas, the stored run of a hash chain, a namespace's keys, random
samples for eviction).

Each function runs inside one read transaction the caller opens (:class:`~kvstore.tiers.disk
.DiskTier` opens it under its remap gate) and reads only keys and the 64-byte headers: a
block's payload is never touched. A value that is not ours (bad header) counts as absent.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import lmdb

from kvstore.tiers.base import BlockMeta, Buffer
from kvstore.tiers.disk_records import MAGIC, decode_key, payload_size, unpack_headers
from kvstore.tiers.lmdb_sample import sample_keys
from kvstore.types import BlockKey


def metas(txn: lmdb.Transaction, raws: Sequence[bytes]) -> list[BlockMeta | None]:
    return unpack_headers(map(txn.get, raws))


def leading(txn: lmdb.Transaction, prefix: bytes, hashes: Sequence[bytes]) -> int:
    """How many of ``hashes``, from the first, are stored (a chain's stored run). Only the
    magic of each header is checked (a lookup's hot loop: half the cost of the whole header);
    a value that is ours but damaged further in reads as a miss when it is got."""
    n = 0
    get = txn.get
    for h in hashes:
        value = get(prefix + h)
        if value is None or value[:4] != MAGIC:
            break
        n += 1
    return n


def keys_with(txn: lmdb.Transaction, prefix: bytes) -> Iterator[tuple[bytes, Buffer]]:
    """Every (encoded key, value) whose key starts with ``prefix``, in key order."""
    cur = txn.cursor()
    if not cur.set_range(prefix):
        return
    for raw, value in cur:
        raw = bytes(raw)
        if not raw.startswith(prefix):
            return
        yield raw, value


def namespace_keys(txn: lmdb.Transaction, namespace: str) -> list[BlockKey]:
    prefix = namespace.encode() + b"\x00"
    return [decode_key(raw) for raw, value in keys_with(txn, prefix)
            if payload_size(value) is not None]


def sample(txn: lmdb.Transaction, weights: dict[str, int], n: int,
           rng: random.Random) -> list[BlockKey]:
    """About ``n`` stored keys at random (:func:`~kvstore.tiers.lmdb_sample.sample_keys`)."""
    return sample_keys(txn, weights, n, rng, lambda ns: ns.encode() + b"\x00", decode_key,
                       lambda value: payload_size(value) is not None)
