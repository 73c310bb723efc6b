"""Traces for the what-if tests: block hashes as the store sees them (SHA-256 outputs), and the
exact replay a curve is checked against."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from kvstore.whatif import Curve, WhatIfTracker, replay


def block(i: int, salt: bytes = b"") -> bytes:
    return hashlib.sha256(salt + i.to_bytes(8, "big")).digest()


def hashes(ids: Sequence[int], salt: bytes = b"") -> list[bytes]:
    table = {i: block(i, salt) for i in set(ids)}
    return [table[i] for i in ids]


def cyclic(n: int, passes: int) -> list[int]:
    """Blocks 0..n-1 read in order, ``passes`` times over."""
    return list(range(n)) * passes


def uniform(n: int, length: int, seed: int = 0) -> list[int]:
    """The independent reference model with uniform popularity over ``n`` blocks."""
    return np.random.default_rng(seed).integers(0, n, length).tolist()


def zipf(n: int, length: int, alpha: float = 0.8, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n + 1) ** alpha
    return rng.choice(n, size=length, p=weights / weights.sum()).tolist()


def feed(tracker: WhatIfTracker, trace: Sequence[bytes], size: int, namespace: str = "ns",
         batch: int = 32) -> None:
    for i in range(0, len(trace), batch):
        tracker.access_many(namespace, trace[i:i + batch], size)


def exact_rates(policy: str, trace: Sequence[bytes], size: int, curve: Curve,
                every: int = 1) -> list[tuple[float, float]]:
    """(estimated, exact) at every ``every``-th point of ``curve``: the exact one from a replay
    of the whole trace through the real policy class at full scale."""
    keys = [("ns", h) for h in trace]
    sizes = [size] * len(keys)
    out = []
    for point in curve.points[::every]:
        hits = replay(policy, keys, sizes, point.capacity_bytes)
        out.append((point.hit_rate, sum(hits) / len(hits)))
    return out


def mae(pairs: list[tuple[float, float]]) -> float:
    return sum(abs(a - b) for a, b in pairs) / len(pairs)
