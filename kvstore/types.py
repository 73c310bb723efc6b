"""Small typed values shared by every part of the store.

A block is addressed by ``(namespace, block_hash)``; tiers, policies and the index all use the
same :data:`BlockKey` tuple so that no layer needs to translate keys.
"""

from __future__ import annotations

from typing import NamedTuple, NewType

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
