"""The paged KV cache: one preallocated tensor and the block manager that hands out its blocks.

The tensor is block-major, ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]``,
so that one block (every layer, K then V) is one contiguous run of ``block_bytes`` bytes: the
unit kvstore stores. Moving a block to or from the store is then one row copy, and a layer's
view (``cache[:, layer]``) is what attention indexes with block tables.

The block manager is also a local prefix cache (as vLLM's automatic prefix caching): a full
block keeps its chained hash after its sequence ends and stays reusable until the allocator
needs it back; free blocks are recycled least recently freed first. Every hash that becomes or
stops being resident is recorded as a residency event for the router.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import NamedTuple

import torch

from engines.decoder.config import EngineConfig, ModelConfig

MAX_EVENTS = 65536  # residency events kept for pollers; older ones are dropped


class KVEvent(NamedTuple):
    """A block hash that became resident (``stored=True``) or was evicted (``False``)."""

    seq: int
    stored: bool
    block_hash: bytes


def allocate_cache(cfg: ModelConfig, ecfg: EngineConfig, dtype: torch.dtype) -> torch.Tensor:
    """The whole cache, zeroed, on ``ecfg.device``."""
    shape = (ecfg.num_blocks, cfg.num_layers, 2, ecfg.block_size, cfg.num_kv_heads, cfg.head_dim)
    return torch.zeros(shape, dtype=dtype, device=ecfg.device)


def block_bytes(cache: torch.Tensor) -> int:
    """Bytes of one block of ``cache`` (every layer, K and V)."""
    return cache[0].numel() * cache.element_size()


class BlockManager:
    """Reference-counted blocks with a hash index. Not thread-safe: the engine loop owns it."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.by_hash: dict[bytes, int] = {}
        # ref == 0 blocks, oldest first; an OrderedDict so that a cached block can leave the
        # middle of the free list in O(1) when a new sequence reuses it
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.events: deque[KVEvent] = deque(maxlen=MAX_EVENTS)
        self._event_seq = 0

    @property
    def num_free(self) -> int:
        return len(self.free)

    def match_prefix(self, hashes: list[bytes]) -> list[int]:
        """Blocks holding the longest resident prefix of ``hashes`` (no references taken)."""
        out: list[int] = []
        for h in hashes:
            b = self.by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def take(self, blocks: list[int]) -> None:
        """Add a reference to each of ``blocks`` (resident prefix blocks being reused)."""
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks with one reference each; a recycled block loses its hash.
        Raises ``RuntimeError`` if fewer than ``n`` are free (callers check ``num_free``)."""
        if n > len(self.free):
            raise RuntimeError(f"need {n} KV blocks, {len(self.free)} free")
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            self._forget(b)
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: list[int]) -> None:
        """Drop one reference from each block; unreferenced blocks keep their hash (so they can
        be reused) and join the free list, last block first so a sequence's tail is recycled
        before its shared head."""
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def publish(self, block: int, block_hash: bytes) -> None:
        """Record that ``block`` now holds the full block named ``block_hash``. A hash already
        resident in another block keeps its first block; this one stays anonymous."""
        if block_hash in self.by_hash or self.hash_of[block] is not None:
            return
        self.hash_of[block] = block_hash
        self.by_hash[block_hash] = block
        self._event(True, block_hash)

    def events_since(self, cursor: int) -> tuple[list[KVEvent], int]:
        """Events with ``seq > cursor`` and the new cursor. If events were dropped since
        ``cursor`` the caller should resync from :meth:`resident_hashes`."""
        return [e for e in self.events if e.seq > cursor], self._event_seq

    def resident_hashes(self) -> list[bytes]:
        return list(self.by_hash)

    def _forget(self, b: int) -> None:
        h = self.hash_of[b]
        if h is not None:
            self.hash_of[b] = None
            del self.by_hash[h]
            self._event(False, h)

    def _event(self, stored: bool, h: bytes) -> None:
        self._event_seq += 1
        self.events.append(KVEvent(self._event_seq, stored, h))
