"""Soak: N concurrent clients (default 32) doing mixed put/get/lookup against one
``kvstore serve`` on loopback for a bounded time; zero errors allowed, server RSS reported.

Half the clients move bytes through shared memory, half over the socket. Every block's bytes
derive from its hash, so each get is checked byte for byte. The server's RSS is sampled from
``/proc`` (anonymous memory separately from the shared host slab); the run fails if
anonymous RSS exceeds the stated overhead (``--rss-overhead``, default 768 MiB: interpreter,
torch, FastAPI, LMDB map pages, in-flight frames), or if any error occurred.

    python bench/soak_server.py --seconds 60            # the issue's run
    python bench/soak_server.py --seconds 5 --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import ByteSize, TypeAdapter

from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash


def _size(text: str) -> int:
    return int(TypeAdapter(ByteSize).validate_python(text))


def block_for(key: bytes, size: int) -> bytes:
    return key * (size // len(key))


def key_for(i: int) -> BlockHash:
    return BlockHash(hashlib.sha256(f"soak/{i}".encode()).digest())


def rss(pid: int) -> dict[str, int]:
    """``{"rss", "anon", "shmem"}`` bytes of a process, from /proc (Linux)."""
    out = {"rss": 0, "anon": 0, "shmem": 0}
    names = {"VmRSS:": "rss", "RssAnon:": "anon", "RssShmem:": "shmem"}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            parts = line.split()
            if parts and parts[0] in names:
                out[names[parts[0]]] = int(parts[1]) * 1024
    except OSError:
        pass
    return out


class Worker(threading.Thread):
    def __init__(self, url: str, ns: str, block: int, keys: int, use_shm: bool, seed: int,
                 until: float) -> None:
        super().__init__(daemon=True)
        self.url, self.ns, self.block, self.keys = url, ns, block, keys
        self.use_shm, self.rng, self.until = use_shm, random.Random(seed), until
        self.ops = {"put": 0, "get": 0, "lookup": 0}
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            with KVStoreClient(self.url, use_shm=self.use_shm, timeout=30) as c:
                while time.monotonic() < self.until:
                    self.step(c)
        except Exception as exc:  # counted, reported, fails the run
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def step(self, c: KVStoreClient) -> None:
        start = self.rng.randrange(self.keys)
        ids = [(start + j) % self.keys for j in range(4)]
        keys = [key_for(i) for i in ids]
        roll = self.rng.random()
        if roll < 0.35:
            r = c.put(self.ns, keys, [block_for(k, self.block) for k in keys])
            if r.stored + r.existing + r.refused != len(keys):
                self.errors.append(f"put accounted {r} for {len(keys)} blocks")
            self.ops["put"] += 1
        elif roll < 0.75:
            for k, got in zip(keys, c.get(self.ns, keys), strict=True):
                if got is not None and got != block_for(k, self.block):
                    self.errors.append(f"get returned wrong bytes for {k.hex()}")
            self.ops["get"] += 1
        else:
            prefix, tiers = c.lookup(self.ns, keys)
            if len(tiers) != prefix or prefix > len(keys):
                self.errors.append(f"lookup gave {prefix} blocks and {len(tiers)} tiers")
            self.ops["lookup"] += 1


def soak(url: str, pid: int | None, args: argparse.Namespace) -> dict[str, Any]:
    block = _size(args.block_bytes)
    with KVStoreClient(url) as c:
        c.register_namespace("soak", block, {"model_id": "soak"})
    until = time.monotonic() + args.seconds
    workers = [Worker(url, "soak", block, args.keys, use_shm=i % 2 == 0, seed=i, until=until)
               for i in range(args.clients)]
    peak = {"rss": 0, "anon": 0, "shmem": 0}
    started = time.monotonic()
    for w in workers:
        w.start()
    while any(w.is_alive() for w in workers):
        if pid is not None:
            now = rss(pid)
            peak = {k: max(peak[k], now[k]) for k in peak}
        time.sleep(0.25)
    elapsed = time.monotonic() - started
    ops = {k: sum(w.ops[k] for w in workers) for k in ("put", "get", "lookup")}
    errors = [e for w in workers for e in w.errors]
    return {"seconds": round(elapsed, 2), "clients": args.clients, "ops": ops,
            "ops_per_s": round(sum(ops.values()) / elapsed, 1), "errors": len(errors),
            "error_samples": errors[:5], "peak_rss": peak,
            "rss_limit_anon": _size(args.rss_overhead)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--block-bytes", default="64KiB")
    p.add_argument("--keys", type=int, default=4000, help="distinct blocks in play")
    p.add_argument("--host-capacity", default="128MiB")
    p.add_argument("--disk-capacity", default="1GiB")
    p.add_argument("--rss-overhead", default="768MiB", help="allowed anonymous RSS")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvsoak-") as tmp:
        srv = ServerProc(Path(tmp) / "data", host_capacity=args.host_capacity,
                         disk_capacity=args.disk_capacity).start()
        try:
            assert srv.proc is not None
            result = soak(srv.url, srv.proc.pid, args)
        finally:
            result_rc = srv.stop()
    result["server_exit"] = result_rc
    ok = result["errors"] == 0 and result["peak_rss"]["anon"] <= result["rss_limit_anon"] \
        and result_rc == 0
    result["ok"] = ok
    mib = 1 << 20
    print(f"soak {result['seconds']} s, {args.clients} clients: {result['ops']} "
          f"({result['ops_per_s']} ops/s), errors {result['errors']}, peak RSS "
          f"{result['peak_rss']['rss'] / mib:.0f} MiB (anon {result['peak_rss']['anon'] / mib:.0f}"
          f" MiB, shm {result['peak_rss']['shmem'] / mib:.0f} MiB; host tier "
          f"{_size(args.host_capacity) / mib:.0f} MiB) -> {'OK' if ok else 'FAIL'}")
    for e in result["error_samples"]:
        print("  error:", e)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
