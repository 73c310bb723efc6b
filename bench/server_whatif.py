"""What the what-if curves cost the server: the same requests against two ``kvstore serve``
processes, one with the curves on (the default: 1% of block hashes sampled) and one with them
off (``--whatif-sample-rate 0``), interleaved, over the TCP data plane.

A put of 32 new 256 KiB blocks (each enters the host tier's tracker) and a get of 32 host hits
(a request to the host tier's), as bench_server moves them; a lookup of a 1,000-block chain
stored whole (nothing fed: a hit is fed by the get that follows it); a new prompt, as an
engine sends it: a lookup of 64 blocks nobody stored (each a miss of every tier, fed to each
tracker), then a put of them (16 KiB, so that the feeding weighs most); and a lookup of a
1,000-block chain nobody stored, alone, the worst case (the lookup itself costs about 60 ns a
block, and every tier's tracker takes each missed block). Target: each >= 0.97 of the same
request with the curves off.

    python bench/bench_server.py --quick --clients '' --json bench/results/server.json
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import row, timed

from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash

BLOCK = 256 << 10  # bench_server's put and get block
BATCH = 32
SMALL = 16 << 10  # a new prompt's blocks: small, so that the feeding weighs most
PROMPT = 64
CHAIN = 1000
ROUNDS = 30  # requests per timed sample


def _keys(tag: str, n: int) -> list[BlockHash]:
    salt = f"{tag}/{time.perf_counter_ns()}/{os.getpid()}"
    return [BlockHash(hashlib.sha256(f"{salt}/{i}".encode()).digest()) for i in range(n)]


class _Side:
    """One server and a TCP client on it, with a stored batch and a stored chain."""

    def __init__(self, root: Path, name: str, *flags: str) -> None:
        self.srv = ServerProc(root / name, "--host-capacity", "512MiB", "--disk-capacity",
                              "2GiB", *flags).start()
        self.c = KVStoreClient(self.srv.url, use_shm=False, transport="tcp")
        layout = {"model_id": "bench", "block_size": 16}
        self.c.register_namespace("w", BLOCK, layout)
        self.c.register_namespace("p", SMALL, layout)
        self.c.register_namespace("l", 64, layout)
        self.blocks = [os.urandom(BLOCK) for _ in range(BATCH)]
        self.small = [os.urandom(SMALL) for _ in range(PROMPT)]
        self.stored = _keys("stored", BATCH)
        self.c.put("w", self.stored, self.blocks)
        self.chain = _keys("chain", CHAIN)
        self.c.put("l", self.chain, [b"k" * 64] * CHAIN)

    def puts(self) -> None:
        for _ in range(ROUNDS):
            keys = _keys("put", BATCH)
            self.c.put("w", keys, self.blocks)
            self.c.delete("w", keys)  # the tier stays as full as it was

    def gets(self) -> None:
        for _ in range(ROUNDS):
            if any(b is None for b in self.c.get("w", self.stored)):
                raise RuntimeError("whatif bench: a stored block missed")

    def hits(self) -> None:
        for _ in range(ROUNDS):
            if self.c.lookup("l", self.chain)[0] != CHAIN:
                raise RuntimeError("whatif bench: the chain is not stored whole")

    def prompts(self) -> None:
        """What an engine does with a prompt nobody sent before: look it up, put it."""
        for _ in range(ROUNDS):
            keys = _keys("prompt", PROMPT)
            if self.c.lookup("p", keys)[0]:
                raise RuntimeError("whatif bench: a new prompt hit")
            self.c.put("p", keys, self.small)
            self.c.delete("p", keys)

    def misses(self) -> None:
        unknown = _keys("unknown", CHAIN)
        for _ in range(ROUNDS):
            self.c.lookup("l", unknown)

    def close(self) -> None:
        self.c.close()
        self.srv.stop()


def _alternating(a: Callable[[], object], b: Callable[[], object],
                 reps: int) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, after a warm-up, each going first in every
    other round (whichever runs second measured 4-7% slower here, on or off alike)."""
    a(), b()
    samples: tuple[list[float], list[float]] = ([], [])
    for rep in range(reps):
        order = ((0, a), (1, b)) if rep % 2 else ((1, b), (0, a))
        for i, fn in order:
            samples[i].append(timed(fn))
    return statistics.median(samples[0]), statistics.median(samples[1])


def whatif_rows(root: Path, reps: int) -> list[dict[str, Any]]:
    on = _Side(root, "whatif-on")
    off = _Side(root, "whatif-off", "--whatif-sample-rate", "0")
    try:
        ops = (("put", "puts", BATCH, BLOCK), ("get", "gets", BATCH, BLOCK),
               ("lookup hit", "hits", CHAIN, 64), ("new prompt", "prompts", PROMPT, SMALL),
               ("lookup miss", "misses", CHAIN, 64))
        rows = []
        for op, method, blocks, size in ops:
            t_on, t_off = _alternating(getattr(on, method), getattr(off, method), reps)
            rate_on, rate_off = ROUNDS * blocks / t_on, ROUNDS * blocks / t_off
            rows.append(row(f"{op} curves off", "blocks/s", rate_off, higher_is_better=True,
                            block_bytes=size, blocks=blocks))
            rows.append(row(f"{op} curves on", "blocks/s", rate_on, "curves off", rate_off,
                            higher_is_better=True, target=0.97, block_bytes=size,
                            blocks=blocks))
        return rows
    finally:
        on.close()
        off.close()
