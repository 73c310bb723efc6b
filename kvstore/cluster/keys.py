"""Where the cluster's state lies in Redis.

Membership is a few small keys under one hash tag (``{kvs}``), so that one script can read or
change them together on a Redis Cluster too. The block index is spread over many keys:

- ``kvs:ix:<namespace>:<bucket>`` is a Redis hash, one per bucket (``2**index_bits`` per
  namespace, the bucket chosen by the block hash), so each stays a small listpack-encoded hash
  (Redis' compact form) and a Redis Cluster spreads the buckets over its shards;
- its field is the block hash (its first :data:`FIELD_BYTES` bytes: a collision can only make
  a peer answer a miss, never serve other bytes, since every fetch names the whole hash);
- its value is one :data:`RECORD_BYTES` record per node holding the block: the node's slot
  (4 bytes, big-endian) and the code of its highest tier holding it (1 byte).
"""

from __future__ import annotations

import xxhash

PREFIX = "kvs"
MEMBERS = f"{PREFIX}:{{m}}:members"  # sorted set: node id -> last heartbeat (Redis ms)
REPORTS = f"{PREFIX}:{{m}}:reports"  # hash: node id -> its NodeReport (JSON)
SLOTS = f"{PREFIX}:{{m}}:slots"  # hash: node id -> its slot, never reused
NEXT_SLOT = f"{PREFIX}:{{m}}:next-slot"  # counter the slots come from
SETTINGS = f"{PREFIX}:{{m}}:settings"  # hash: what every node must agree on (index_bits)
ORPHANS = f"{PREFIX}:{{m}}:orphans"  # set: slots of pruned nodes whose records await a sweep
SWEEPER = f"{PREFIX}:{{m}}:sweeper"  # string: the node sweeping now (a lease, PX)
INDEX_MATCH = f"{PREFIX}:ix:*"  # every index bucket of every namespace

FIELD_BYTES = 16
SLOT_BYTES = 4
RECORD_BYTES = SLOT_BYTES + 1

# a tier's code in index records; the shared S3 tier is never published (every node reads it)
TIER_CODES = {"device": 0, "host": 1, "disk": 2}
TIER_NAMES = {code: name for name, code in TIER_CODES.items()}


def bucket_key(namespace: str, block_hash: bytes, bits: int) -> str:
    """The index key holding ``block_hash`` of ``namespace``."""
    bucket = xxhash.xxh3_64_intdigest(block_hash) & ((1 << bits) - 1)
    return f"{PREFIX}:ix:{namespace}:{bucket:x}"


def field(block_hash: bytes) -> bytes:
    return block_hash[:FIELD_BYTES]


def slot_bytes(slot: int) -> bytes:
    return slot.to_bytes(SLOT_BYTES, "big")


def records(value: bytes | None) -> list[tuple[int, int]]:
    """The ``(slot, tier code)`` pairs of an index value (none for a missing field)."""
    if not value:
        return []
    return [(int.from_bytes(value[i:i + SLOT_BYTES], "big"), value[i + SLOT_BYTES])
            for i in range(0, len(value) - RECORD_BYTES + 1, RECORD_BYTES)]
