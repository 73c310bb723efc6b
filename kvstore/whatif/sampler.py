"""Spatial sampling by block hash (SHARDS, Waldspurger et al., FAST'15): a block is tracked
when its hash, read as a uniform 64-bit value, is below a threshold ``rate * 2**64``.

A block is either always sampled or never (for a given threshold), so the sample keeps every
access of the blocks it holds and reuse distances among them are exact, only scaled by
``1 / rate``. Chained block hashes are SHA-256 or xxhash outputs: their first 8 bytes are
uniform already, and the test is one comparison of the hash with an 8-byte threshold (bytes
compare lexicographically, and a hash longer than the threshold that starts with it compares
greater, so ``hash < threshold`` is exactly ``hash[:8] < threshold``). Keys that are not hash
outputs are hashed first (``uniform=False``).

Lowering the threshold (fixed-size SHARDS) only ever drops keys from the sample: every key
still sampled was sampled before.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

import numpy as np

_SPACE = 1 << 64
_VECTOR = 256  # hashes from which numpy's test beats a comprehension's (measured: ~200)


def _digest(block_hash: bytes) -> bytes:
    return blake2b(block_hash, digest_size=8).digest()


class SpatialSampler:
    """The sampling threshold and the test. Not thread-safe (its owner's lock covers it)."""

    __slots__ = ("_limit", "_threshold", "uniform")

    def __init__(self, rate: float, uniform: bool = True) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"sample rate must be in (0, 1], got {rate}")
        self.uniform = uniform
        self._limit = _SPACE
        self._threshold: bytes | None = None  # None: every key is sampled
        self.set_limit(min(_SPACE, round(rate * _SPACE)))

    @property
    def rate(self) -> float:
        """The fraction of keys sampled now."""
        return self._limit / _SPACE

    @property
    def limit(self) -> int:
        """Keys whose value is below this are sampled (``2**64``: all of them)."""
        return self._limit

    def set_limit(self, limit: int) -> None:
        """Sample the keys whose value is below ``limit`` from now on (1 to ``2**64``)."""
        if not 0 < limit <= _SPACE:
            raise ValueError(f"limit must be in 1..2**64, got {limit}")
        self._limit = limit
        self._threshold = None if limit == _SPACE else limit.to_bytes(8, "big")

    def value(self, block_hash: bytes) -> int:
        """The key's 64-bit sample value (its first 8 bytes, big-endian, zero-padded)."""
        head = block_hash[:8] if self.uniform else _digest(block_hash)
        return int.from_bytes(head.ljust(8, b"\0"), "big")

    def picks(self, hashes: Sequence[bytes]) -> list[int]:
        """Positions in ``hashes`` of the sampled ones: one comparison per unsampled hash (a
        whole-array one for a long run of 32-byte hashes: 16 ns a hash instead of 35)."""
        threshold = self._threshold
        if threshold is None:
            return list(range(len(hashes)))
        if not self.uniform:
            return [i for i, h in enumerate(hashes) if _digest(h) < threshold]
        if len(hashes) >= _VECTOR:
            joined = b"".join(hashes)
            if len(joined) == 32 * len(hashes):
                heads = np.frombuffer(joined, dtype=">u8").reshape(len(hashes), 4)[:, 0]
                return np.flatnonzero(heads < np.uint64(self._limit)).tolist()
        return [i for i, h in enumerate(hashes) if h < threshold]

    def sampled(self, block_hash: bytes) -> bool:
        return bool(self.picks((block_hash,)))
