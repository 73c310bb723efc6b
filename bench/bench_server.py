"""The server's data paths: how fast block bytes move through ``kvstore serve``.

Rows (each against a baseline measured in the same run, as bench/common.py reports them):
- put/get GB/s of 256 KiB and 2 MiB blocks through (a) the shared-memory local path, (b) the
  TCP data plane, (c) REST single-block PUT/GET (``http.client``, each body read into a
  preallocated buffer), beside (d) a plain memcpy of the same bytes into preallocated
  buffers, (e) redis-server + redis-py (pipelined SET/GET) storing the same blocks and (f)
  a raw Python socket (``bench/raw_socket.py``: the same bytes between two
  processes, ``sendmsg`` out, ``recv_into`` preallocated buffers), over TCP and over a Unix
  socket; the kvstore socket rows appear twice, against Redis and against the raw socket;
- lookup latency p50/p99 of a 1k-block chain over REST and over the data plane;
- the cost of the what-if curves: put, get and lookup of small blocks against a server with
  them on and one with them off (``bench/server_whatif.py``; ``--only whatif`` runs these
  alone);
- with ``--clients 1,2,4,8`` (the default), separate client processes at once against a
  server with a 256 MiB host tier over disk (``bench/server_clients.py``): aggregate get GB/s
  and p99 over shared memory and over TCP with each number of clients, and get p99 alone
  and beside a client whose paced puts make the host tier demote to disk (``--only clients``
  runs these alone, with the counts of ``--clients``).

Targets: shared-memory put >= 0.70 of memcpy, shared-memory get (each copy verified against
the block's checksum, hashed a chunk at a time as it is copied) >= 0.85 of memcpy, beside
"memcpy then xxh3" (a copy, then a hash of it: the naive floor of a verified copy, and of a
put's writer, which hashes what it copies; the server then hashes the slab's bytes); TCP data
plane faster than Redis; TCP and Unix socket put and get (into preallocated
buffers, as the raw socket receives) >= 0.80 of the raw socket of the same kind, REST get of
one 2 MiB block >= 0.50 of the raw TCP socket; aggregate with the most clients >=
0.90 of one client's, and get p99 beside demoting puts at most 2x the p99 alone (ratio >=
0.50); each request with the what-if curves on >= 0.97 of the same with them off.
Cases are interleaved (A B C ... A B C) and medians taken after a warm-up. The server and
Redis run on loopback ports of this machine and are stopped at the end.

    python bench/bench_server.py --quick --json bench/results/server.json
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from common import report, row
from raw_socket import RawServer
from server_clients import client_rows
from server_whatif import whatif_rows

from kvstore.checksum import checksum
from kvstore.client import KVStoreClient
from kvstore.testing.proc import free_port
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash

Case = tuple[Callable[[], object], Callable[[], object], Callable[[], object]]  # setup, run, after


def interleave(cases: dict[str, Case], reps: int, warmup: int) -> dict[str, float]:
    """Median seconds of each case's ``run``; ``setup``/``after`` are not timed."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(warmup + reps):
        for name, (setup, run, after) in cases.items():
            setup()
            start = time.perf_counter()
            run()
            elapsed = time.perf_counter() - start
            after()
            if rep >= warmup:
                samples[name].append(elapsed)
    return {name: statistics.median(s) for name, s in samples.items()}


class Redis:
    """redis-server on a free loopback port, no persistence; stopped by :meth:`close`."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(exe):
            raise FileNotFoundError("redis-server not installed (apt-get install redis-server)")
        import redis

        self.port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        for _ in range(100):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)

    def put(self, keys: Sequence[bytes], blocks: list[bytes]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for k, b in zip(keys, blocks, strict=True):
            pipe.set(k, b)
        pipe.execute()

    def get(self, keys: Sequence[bytes]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.get(k)
        return list(pipe.execute())

    def delete(self, keys: Sequence[bytes]) -> None:
        self.client.delete(*keys)

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(10)


class RestBlocks:
    """Single-block REST PUT and GET over one keep-alive connection with the standard
    library's ``http.client``, each GET's body read into a preallocated buffer (as the raw
    socket reads). httpx spends more CPU on a 2 MiB body than the server does (it gathers
    the body in 64 KiB pieces and joins them), which would measure the client."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def put(self, ns: str, keys: Sequence[BlockHash], blocks: Sequence[bytes]) -> None:
        for k, b in zip(keys, blocks, strict=True):
            self.conn.request("PUT", f"/v1/blocks/{ns}/{k.hex()}", body=b,
                              headers={"content-type": "application/octet-stream"})
            self._check(self.conn.getresponse(), None)

    def get_into(self, ns: str, keys: Sequence[BlockHash], dest: Sequence[bytearray]) -> None:
        for k, d in zip(keys, dest, strict=True):
            self.conn.request("GET", f"/v1/blocks/{ns}/{k.hex()}")
            self._check(self.conn.getresponse(), d)

    @staticmethod
    def _check(resp: http.client.HTTPResponse, into: bytearray | None) -> None:
        if resp.status >= 300:
            raise RuntimeError(f"REST {resp.status}: {resp.read()[:200]!r}")
        if into is None:
            resp.read()
        elif resp.readinto(into) != len(into) or resp.read():
            raise RuntimeError("REST get: body of the wrong size")

    def close(self) -> None:
        self.conn.close()


def keys_for(tag: str, n: int) -> list[BlockHash]:
    return [BlockHash(hashlib.sha256(f"{tag}/{i}/{time.perf_counter_ns()}".encode()).digest())
            for i in range(n)]


def throughput_rows(srv: ServerProc, redis: Redis | None, raw: RawServer, block: int,
                    count: int, reps: int, warmup: int) -> list[dict[str, Any]]:
    ns = f"bench-{block}"
    blocks = [os.urandom(block) for _ in range(count)]
    dest = [bytearray(block) for _ in range(count)]
    total = block * count
    shm = KVStoreClient(srv.url, use_shm=True)
    unix = KVStoreClient(srv.url, use_shm=False, transport="unix")
    tcp = KVStoreClient(srv.url, use_shm=False, transport="tcp")
    rest = RestBlocks(srv.port)
    raw_tcp, raw_unix = raw.connect(), raw.connect(unix=True)
    shm.register_namespace(ns, block, {"model_id": "bench"})
    fresh: dict[str, list[BlockHash]] = {}

    def memcpy_put() -> None:
        for d, b in zip(dest, blocks, strict=True):
            d[:] = b

    def memcpy_xxh3_put() -> None:  # the writer's part of a checked put, done naively
        for d, b in zip(dest, blocks, strict=True):
            d[:] = b
            checksum(b)

    def put_case(name: str, fn: Callable[[list[BlockHash]], object],
                 drop: Callable[[list[BlockHash]], object]) -> Case:
        return (lambda: fresh.__setitem__(name, keys_for(name, count)),
                lambda: fn(fresh[name]), lambda: drop(fresh[name]))

    def drop(keys: list[BlockHash]) -> None:
        shm.delete(ns, keys)

    def nothing() -> None:
        return None

    put_cases: dict[str, Case] = {
        "memcpy": (nothing, memcpy_put, nothing),
        "memcpy xxh3": (nothing, memcpy_xxh3_put, nothing),
        "shm": put_case("shm", lambda k: shm.put(ns, k, blocks), drop),
        "tcp": put_case("tcp", lambda k: tcp.put(ns, k, blocks), drop),
        "unix": put_case("unix", lambda k: unix.put(ns, k, blocks), drop),
        "rest": put_case("rest", lambda k: rest.put(ns, k, blocks), drop),
        "raw socket": (nothing, lambda: raw_tcp.put(blocks), nothing),
        "raw unix socket": (nothing, lambda: raw_unix.put(blocks), nothing),
    }
    if redis is not None:
        put_cases["redis"] = put_case("redis", lambda k: redis.put(k, blocks), redis.delete)
    put_t = interleave(put_cases, reps, warmup)

    stored = keys_for("stored", count)
    shm.put(ns, stored, blocks)
    if redis is not None:
        redis.put(stored, blocks)

    def check(got: list[Any]) -> None:
        if any(g is None for g in got):
            raise RuntimeError("bench get missed a stored block")

    def check_into(found: list[bool]) -> None:
        if not all(found):
            raise RuntimeError("bench get_into missed a stored block")

    def memcpy_get() -> None:
        for d, b in zip(dest, blocks, strict=True):
            d[:] = b

    def memcpy_xxh3_get() -> None:  # the floor of a verified copy done naively
        for d, b in zip(dest, blocks, strict=True):
            d[:] = b
            checksum(d)

    get_cases: dict[str, Case] = {
        "memcpy": (nothing, memcpy_get, nothing),
        "memcpy xxh3": (nothing, memcpy_xxh3_get, nothing),
        "shm": (nothing, lambda: shm.get_into(ns, stored, dest), nothing),
        "shm bytes": (nothing, lambda: check(shm.get(ns, stored)), nothing),
        "tcp": (nothing, lambda: check(tcp.get(ns, stored)), nothing),
        "unix": (nothing, lambda: check(unix.get(ns, stored)), nothing),
        "tcp into": (nothing, lambda: check_into(tcp.get_into(ns, stored, dest)), nothing),
        "unix into": (nothing, lambda: check_into(unix.get_into(ns, stored, dest)), nothing),
        "rest": (nothing, lambda: rest.get_into(ns, stored, dest), nothing),
        "raw socket": (nothing, lambda: raw_tcp.get_into(dest), nothing),
        "raw unix socket": (nothing, lambda: raw_unix.get_into(dest), nothing),
    }
    if redis is not None:
        get_cases["redis"] = (nothing, lambda: check(redis.get(stored)), nothing)
    get_t = interleave(get_cases, reps, warmup)
    for c in (shm, unix, tcp):
        c.close()
    for r in (raw_tcp, raw_unix):
        r.close()
    rest.close()

    def gbps(seconds: float) -> float:
        return total / seconds / 1e9

    rows = []
    for op, times in (("put", put_t), ("get", get_t)):
        mem = gbps(times["memcpy"])
        red = gbps(times["redis"]) if "redis" in times else None
        rows.append(row(f"memcpy {op}", "GB/s", mem, block_bytes=block, higher_is_better=True))
        # a shared-memory get verifies each block's checksum as it copies (kvstore.checksum)
        rows.append(row("shm get (verified)" if op == "get" else f"shm {op}", "GB/s",
                        gbps(times["shm"]), "memcpy", mem, higher_is_better=True,
                        target=0.85 if op == "get" else 0.70, block_bytes=block))
        rows.append(row(f"memcpy then xxh3 {op}", "GB/s", gbps(times["memcpy xxh3"]),
                        "memcpy", mem, higher_is_better=True, block_bytes=block))
        if op == "get":
            rows.append(row("shm get (bytes)", "GB/s", gbps(times["shm bytes"]), "memcpy", mem,
                            higher_is_better=True, block_bytes=block))
        for name in ("tcp", "unix", "rest"):
            rows.append(row(f"{name} {op}", "GB/s", gbps(times[name]),
                            "redis" if red else None, red, higher_is_better=True,
                            target=1.0 if name == "tcp" and red else None, block_bytes=block))
        if red is not None:
            rows.append(row(f"redis {op}", "GB/s", red, block_bytes=block,
                            higher_is_better=True))
    for op, times in (("put", put_t), ("get", get_t)):
        rows += raw_rows(op, block, {name: gbps(t) for name, t in times.items()})
    return rows


def raw_rows(op: str, block: int, rate: dict[str, float]) -> list[dict[str, Any]]:
    """The second set: kvstore's socket paths against the raw socket of the same kind."""
    tcp, unix = rate["raw socket"], rate["raw unix socket"]
    into = op == "get"  # a get lands in preallocated buffers, as the raw socket's does
    rows = [row(f"raw socket {op}", "GB/s", tcp, block_bytes=block, higher_is_better=True),
            row(f"raw unix socket {op}", "GB/s", unix, block_bytes=block,
                higher_is_better=True)]
    for name, base, base_value in (("tcp", "raw socket", tcp), ("unix", "raw unix socket", unix)):
        rows.append(row(f"{name} get_into" if into else f"{name} put", "GB/s",
                        rate[f"{name} into" if into else name], base, base_value,
                        higher_is_better=True, target=0.80, block_bytes=block))
    if op == "get":
        rows.append(row("tcp get (bytes)", "GB/s", rate["tcp"], "raw socket", tcp,
                        higher_is_better=True, block_bytes=block))
    rows.append(row(f"rest {op}", "GB/s", rate["rest"], "raw socket", tcp,
                    higher_is_better=True, block_bytes=block,
                    target=0.50 if op == "get" and block >= (2 << 20) else None))
    return rows


def lookup_rows(srv: ServerProc, chain: int, reps: int) -> list[dict[str, Any]]:
    ns = "bench-lookup"
    with KVStoreClient(srv.url, transport="tcp") as tcp, httpx.Client(base_url=srv.url) as rest:
        tcp.register_namespace(ns, 64, {"model_id": "bench"})
        hashes = keys_for("chain", chain)
        tcp.put(ns, hashes, [b"k" * 64] * chain)
        body = {"namespace": ns, "block_hashes": [h.hex() for h in hashes]}
        samples: dict[str, list[float]] = {"rest": [], "data": []}
        for rep in range(reps + 3):
            t0 = time.perf_counter()
            r = rest.post("/v1/lookup", json=body)
            t1 = time.perf_counter()
            prefix, _ = tcp.lookup(ns, hashes)
            t2 = time.perf_counter()
            if r.json()["prefix_blocks"] != chain or prefix != chain:
                raise RuntimeError("lookup bench: chain not fully cached")
            if rep >= 3:
                samples["rest"].append(t1 - t0)
                samples["data"].append(t2 - t1)
    rows = []
    for q, name in ((50, "p50"), (99, "p99")):
        rest_v = 1e3 * _pct(samples["rest"], q)
        data_v = 1e3 * _pct(samples["data"], q)
        rows.append(row(f"lookup {chain} REST {name}", "ms", rest_v, higher_is_better=False))
        rows.append(row(f"lookup {chain} data plane {name}", "ms", data_v, "REST", rest_v,
                        higher_is_better=False))
    return rows


def _pct(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def many_clients(tmp: Path, counts: list[int], quick: bool) -> list[dict[str, Any]]:
    """The many-clients rows, against a server of their own (a 256 MiB host tier)."""
    small = ServerProc(tmp / "clients", host_capacity="256MiB", disk_capacity="4GiB")
    small.start()
    try:
        return client_rows(small, 256 << 20, counts, 0.4 if quick else 2.0, 1 if quick else 3)
    finally:
        small.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="well under a minute, every row")
    p.add_argument("--json", default=None, help="write the report (JSON) here")
    p.add_argument("--clients", default="1,2,4,8",
                   help="client process counts for the many-clients rows ('' for none)")
    p.add_argument("--only", choices=("whatif", "clients"), help="run one section alone")
    args = p.parse_args()
    counts = [int(n) for n in args.clients.split(",") if n.strip()]
    reps, warmup = (3, 1) if args.quick else (9, 2)
    batch_bytes = (8 << 20) if args.quick else (32 << 20)
    if args.only is not None:
        with tempfile.TemporaryDirectory(prefix="kvbench-") as tmp:
            report("server", whatif_rows(Path(tmp), 5 if args.quick else 21)
                   if args.only == "whatif" else many_clients(Path(tmp), counts or [1],
                                                              args.quick), args.json)
        return 0
    with tempfile.TemporaryDirectory(prefix="kvbench-") as tmp:
        srv = ServerProc(Path(tmp) / "data", host_capacity="1GiB", disk_capacity="4GiB")
        srv.start()
        redis: Redis | None = None
        raw = RawServer()
        try:
            try:
                redis = Redis()
            except FileNotFoundError as exc:
                print(f"note: {exc}; Redis rows left out", file=sys.stderr)
            rows: list[dict[str, Any]] = []
            for block in (256 << 10, 2 << 20):
                rows += throughput_rows(srv, redis, raw, block, batch_bytes // block, reps,
                                        warmup)
            rows += lookup_rows(srv, 1000, 30 if args.quick else 300)
            rows += whatif_rows(Path(tmp), 5 if args.quick else 21)
        finally:
            if redis is not None:
                redis.close()
            raw.close()
            srv.stop()
        if counts:
            rows += many_clients(Path(tmp), counts, args.quick)
    report("server", rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
