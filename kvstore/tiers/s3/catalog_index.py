"""The S3 catalog as the store's index of what this node holds in S3: metas, the stored run of a
hash chain, a namespace's keys, random samples for eviction (as ``tiers/disk/index`` does for
the disk tier's file).

Each function runs inside one read transaction the caller opens
(:meth:`~kvstore.tiers.s3.catalog.CatalogFile.read`) and reads only the live-block records.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import cast

import lmdb

from kvstore.tiers.base import BlockMeta
from kvstore.tiers.lmdb_keys import keys_with, sample_keys
from kvstore.tiers.s3.catalog_records import LIVE, decode_key, live_meta, ns_prefix
from kvstore.types import BlockKey


def metas(txn: lmdb.Transaction, raws: Sequence[bytes]) -> list[BlockMeta | None]:
    return [None if v is None else live_meta(cast(bytes, v)) for v in map(txn.get, raws)]


def leading(txn: lmdb.Transaction, prefix: bytes, hashes: Sequence[bytes]) -> int:
    """How many of ``hashes``, from the first, are live blocks (a chain's stored run)."""
    n = 0
    get = txn.get
    for h in hashes:
        if get(prefix + h) is None:
            break
        n += 1
    return n


def namespace_keys(txn: lmdb.Transaction, namespace: str) -> list[BlockKey]:
    return [decode_key(raw) for raw, _ in keys_with(txn, ns_prefix(LIVE, namespace))]


def sample(txn: lmdb.Transaction, weights: dict[str, int], n: int,
           rng: random.Random) -> list[BlockKey]:
    """About ``n`` live keys at random (:func:`~kvstore.tiers.lmdb_keys.sample_keys`)."""
    return sample_keys(txn, weights, n, rng, lambda ns: ns_prefix(LIVE, ns), decode_key)
