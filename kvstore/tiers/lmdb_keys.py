"""Keys of an LMDB file whose keys are grouped by namespace prefix and end in a block hash (the
disk tier's file, the S3 tier's catalog): every key under a prefix, and random keys for the
sampled eviction policies.

For a sample, a namespace is drawn by its block count, then the cursor seeks to a random hash
in it (block hashes are uniform, so the key after that point is close to uniform) and takes
the :data:`SAMPLE_RUN` keys from there, wrapping to the namespace's first key past its last.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import lmdb

from kvstore.tiers.base import Buffer
from kvstore.types import BlockKey

SAMPLE_RUN = 4  # keys taken after each random seek: a seek costs more than a step


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


def sample_keys(txn: lmdb.Transaction, weights: dict[str, int], n: int, rng: random.Random,
                prefix_of: Callable[[str], bytes], decode: Callable[[bytes], BlockKey],
                keep: Callable[[Buffer], bool] | None = None) -> list[BlockKey]:
    """About ``n`` keys at random (``weights``: namespace -> block count). ``prefix_of``
    gives a namespace's key prefix, ``decode`` a raw key's block key; ``keep(value)``, when
    given, says whether an entry is a block (others are stepped over)."""
    names = [ns for ns, count in weights.items() if count > 0]
    if not names:
        return []
    out: list[BlockKey] = []
    cur = txn.cursor()
    for ns in rng.choices(names, weights=[weights[ns] for ns in names],
                          k=max(1, -(-n // SAMPLE_RUN))):
        prefix = prefix_of(ns)
        if not cur.set_range(prefix + rng.randbytes(8)) or not bytes(cur.key()).startswith(prefix):
            cur.set_range(prefix)  # past the namespace's last key: wrap to its first
        for _ in range(SAMPLE_RUN):
            raw = bytes(cur.key())
            if not raw.startswith(prefix):
                break
            if keep is None or keep(cur.value()):
                out.append(decode(raw))
            if not cur.next():
                break
    return out
