"""The S3 catalog as the store's index of what this node holds in S3: metas, the stored run of a
hash chain, a namespace's keys, random samples for eviction (as ``tiers/disk_index`` does for
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
from kvstore.tiers.s3.catalog_records import LIVE, decode_key, live_meta, ns_prefix
from kvstore.types import BlockKey

SAMPLE_RUN = 4  # keys taken after each random seek: a seek costs more than a step


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
    prefix = ns_prefix(LIVE, namespace)
    cur = txn.cursor()
    out: list[BlockKey] = []
    if not cur.set_range(prefix):
        return out
    for raw in map(bytes, cur.iternext(keys=True, values=False)):
        if not raw.startswith(prefix):
            break
        out.append(decode_key(raw))
    return out


def sample(txn: lmdb.Transaction, weights: dict[str, int], n: int,
           rng: random.Random) -> list[BlockKey]:
    """About ``n`` live keys at random: a namespace drawn by its block count, then a seek to a
    random hash in it (block hashes are uniform) and the :data:`SAMPLE_RUN` keys from there."""
    names = [ns for ns, count in weights.items() if count > 0]
    if not names:
        return []
    out: list[BlockKey] = []
    cur = txn.cursor()
    for ns in rng.choices(names, weights=[weights[ns] for ns in names],
                          k=max(1, -(-n // SAMPLE_RUN))):
        prefix = ns_prefix(LIVE, ns)
        if not cur.set_range(prefix + rng.randbytes(8)) or not bytes(cur.key()).startswith(prefix):
            cur.set_range(prefix)  # past the namespace's last key: wrap to its first
        for _ in range(SAMPLE_RUN):
            raw = bytes(cur.key())
            if not raw.startswith(prefix):
                break
            out.append(decode_key(raw))
            if not cur.next():
                break
    return out
