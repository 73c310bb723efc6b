"""One client process of ``bench/soak_integrity.py``: puts, gets and (for a deleter) namespace
deletes in one namespace, over one transport, until a deadline; it checks every block a get
returns against the bytes its (namespace, hash) stand for, and writes its counts to a JSON
file every second (the soak may SIGSTOP it, or kill the server under it).

    python bench/soak_actor.py '{"url": ..., "token": ..., "ns": ..., "role": "writer", ...}'
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from kvstore.client import KVStoreClient
from kvstore.client.exchange import Call, Link, Steps
from kvstore.protocol import ExtentsReply, PutReply, ShmCommit, ShmReserve
from kvstore.types import BlockHash

KEYS = 2000  # distinct hashes per namespace


def block_hash(i: int) -> BlockHash:
    """The same hashes in every namespace: a block landing in another tenant's namespace, or
    another tenant's bytes in this one, shows as wrong bytes."""
    return BlockHash(hashlib.sha256(b"soak-integrity:%d" % i).digest())


def seed_of(ns: str, h: bytes) -> bytes:
    return hashlib.sha256(ns.encode() + b"\x00" + h).digest()


def expected(ns: str, h: bytes, size: int) -> bytes:
    """The only bytes block ``h`` of namespace ``ns`` may ever hold."""
    seed = seed_of(ns, h)
    return (seed * (size // len(seed) + 1))[:size]


def _reserve(link: Link, ns: str, hashes: list[BlockHash], lease_s: float) -> Steps[ExtentsReply]:
    header, _ = yield Call(ShmReserve(ns, hashes, lease_s))
    return ExtentsReply.from_header(header)


def _commit(link: Link, ns: str, hashes: list[BlockHash],
            gens: list[int | None]) -> Steps[PutReply]:
    header, _ = yield Call(ShmCommit(ns, hashes, gens))
    return PutReply.from_header(header)


class Actor:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.ns: str = spec["ns"]
        self.size: int = spec["block_bytes"]
        self.rng = random.Random(spec["seed"])
        self.until = time.time() + spec["seconds"]
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.first: dict[str, str] = {}  # the first message of each kind of error
        self.out = Path(spec["out"])
        self._written = 0.0
        self._stop = False
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, *_: object) -> None:
        self._stop = True

    def client(self) -> KVStoreClient:
        spec = self.spec
        c = KVStoreClient(spec["url"], spec["token"], use_shm=spec["transport"] == "shm",
                          transport="unix" if spec["transport"] == "unix" else
                          "tcp" if spec["transport"] == "tcp" else "auto", timeout=10)
        c.register_namespace(self.ns, self.size, {"model_id": "soak"})
        return c

    def run(self) -> None:
        c: KVStoreClient | None = None
        while not self._stop and time.time() < self.until:
            try:
                if c is None:
                    c = self.client()
                    self.save(force=True)  # the soak waits for every client to be up
                self.step(c)
            except Exception as exc:  # the server was killed, the namespace deleted, ...
                self.errors[type(exc).__name__] += 1
                self.first.setdefault(type(exc).__name__, str(exc)[:300])
                if c is not None:
                    with contextlib.suppress(Exception):
                        c.close()
                c = None
                time.sleep(0.2)
            self.save()
        if c is not None:
            with contextlib.suppress(Exception):
                c.close()
        self.save(force=True)

    def step(self, c: KVStoreClient) -> None:
        role = self.spec["role"]
        start = self.rng.randrange(KEYS)
        n = self.rng.randint(4, 16)
        ids = [(start + j) % KEYS for j in range(n)]
        hashes = [block_hash(i) for i in ids]
        roll = self.rng.random()
        if role == "late_shm":
            self.late_write(c, hashes[:4])
        elif role == "deleter" and roll < 0.05:
            c.delete_namespace(self.ns)
            self.counts["namespace_deletes"] += 1
            c.register_namespace(self.ns, self.size, {"model_id": "soak"})
        elif role in ("writer", "deleter") and roll < 0.6:
            durable = self.spec["transport"] != "shm" and self.rng.random() < 0.3
            r = c.put(self.ns, hashes, [expected(self.ns, h, self.size) for h in hashes],
                      durable=durable)
            self.counts["acknowledged"] += r.stored + r.existing
            self.counts["acknowledged_durable"] += (r.stored + r.existing) * durable
            self.counts["refused"] += r.refused
        else:
            got = c.get(self.ns, hashes)
            self.counts["reads"] += len(hashes)
            for h, data in zip(hashes, got, strict=True):
                if data is None:
                    self.counts["misses"] += 1
                elif data != expected(self.ns, h, self.size):
                    self.counts["wrong"] += 1
                    if len(self.wrong) < 20:  # what it got: the seed its first bytes hold
                        self.wrong.append(f"{self.ns}/{h.hex()[:16]} got {data[:32].hex()}")
                else:
                    self.counts["hits"] += 1

    def late_write(self, c: KVStoreClient, hashes: list[BlockHash]) -> None:
        """A shared-memory writer stalled after its generation check (a GC pause, the OS):
        it reserves places with a short lease, checks them, stalls past the lease, then
        copies its bytes in without checking again, and commits. The server cannot stop the
        copy; what it must ensure is that the bytes never reach another block."""
        reserved = c._run(_reserve, self.ns, hashes, 0.5)
        slab = c._core.slab
        extents = [e for e in reserved.extents if e is not None]
        if slab is None or len(extents) != len(hashes):
            return
        if not all(slab.current(e, g) for e, g in zip(extents, reserved.gens, strict=True)):
            return
        time.sleep(self.rng.uniform(1.5, 3.0))
        for h, ext in zip(hashes, extents, strict=True):
            data, at = expected(self.ns, h, self.size), 0
            for off, n in ext:
                slab.buf[off:off + n] = data[at:at + n]
                at += n
        r = c._run(_commit, self.ns, hashes, reserved.gens)
        self.counts["late_copies"] += len(hashes)
        self.counts["late_commits_stored"] += r.stored

    def save(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._written < 1.0:
            return
        self._written = now
        doc = {"spec": {k: v for k, v in self.spec.items() if k != "token"},
               "counts": dict(self.counts), "errors": dict(self.errors), "wrong": self.wrong,
               "first_errors": self.first}
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.out)


if __name__ == "__main__":
    Actor(json.loads(sys.argv[1])).run()
