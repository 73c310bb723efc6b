"""Small typed values shared by every part of the store.

A block is addressed by ``(namespace, block_hash)``; tiers, policies and the index all use the
same :data:`BlockKey` tuple so that no layer needs to translate keys.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, NewType

Buffer = bytes | bytearray | memoryview  # bytes a block is read from or written into

BlockHash = NewType("BlockHash", bytes)
"""A chained prefix block hash, raw bytes (32 bytes for the sha256 algorithms, 16 for xxhash)."""

BlockKey = tuple[str, bytes]
"""``(namespace, block_hash)``: the one key every tier, policy and index uses."""


class LookupResult(NamedTuple):
    """Longest cached prefix of a hash chain.

    ``tiers[i]`` names the top tier that holds block ``i`` of the prefix; ``len(tiers) ==
    prefix_blocks``.
    """

    prefix_blocks: int
    tiers: list[str]


class PutResult(NamedTuple):
    """What a batched put did: blocks newly stored, blocks that were already present, and
    blocks refused (no room anywhere because everything evictable is pinned)."""

    stored: int
    existing: int
    refused: int


CorruptCause = Literal["read", "send", "client", "demote", "disk_page", "disk_header",
                       "disk_write"]
"""Why a block was dropped as corrupt: it failed its checksum in a read by the store (a socket
or REST get, a promotion), in the check of a get reply's slab bytes before sending, in a
client's copy out of shared memory (the client tells the server), or in the check of a
demotion's or spill's bytes; or the disk tier found it on a damaged LMDB page (``disk_page``),
with an invalid header (``disk_header``), or unwritable for a damaged neighbour page
(``disk_write``)."""

LeftBecause = Literal["evicted", "deleted", "corrupt", "lost"]
"""Why a block left the store: evicted from the last tier that held it to make room, deleted by
a client, dropped because its checksum failed, or lost by its tier behind the store's back (an
S3 object gone)."""


class Ghost(NamedTuple):
    """A block that left the store: ``at`` (Unix time, seconds), the ``tier`` it left from (the
    last one that held it; for a delete, the top one) and ``why``."""

    at: float
    tier: str
    why: LeftBecause


class Trace(NamedTuple):
    """Where each block of a chain is (``tiers[i]``: every tier holding block ``i``, top first;
    empty if none) and, for blocks the store does not hold, the ghost of its departure if the
    ghost record still has one. ``ghosts_kept`` and ``ghost_capacity`` say how full the record
    is: a block older than its oldest ghost reads as never stored."""

    tiers: list[list[str]]
    ghosts: list[Ghost | None]
    ghosts_kept: int
    ghost_capacity: int
