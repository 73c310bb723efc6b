"""Many clients of one ``kvstore serve`` at once, for ``bench_server.py --clients``: aggregate
get throughput and p99 latency with 1, 2, 4, 8... client processes, and get latency beside
puts that make the host tier demote to disk.

Each client is its own process (``multiprocessing``, forked), started once and told what
to do: for a fixed time, get the same batch of its own blocks over and over (through shared
memory, or into preallocated buffers over TCP) and report the bytes it moved and the latency
of each get; or put fresh blocks at a fixed pace. Every client of a round starts at the same
moment. The aggregate is the bytes all clients moved over the round's length; its baseline is
the one-client figure of the same run.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

from common import row

from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash

BLOCK = 256 << 10
BATCH = 4  # blocks per get: 1 MiB
PUT_BATCH = 32  # blocks per put beside the gets: 8 MiB ...
PUT_PACE_S = 0.1  # ... every 100 ms: 80 MB/s demoted to disk once the host tier is full
START_S = 0.3  # clients are told to start this long after the command leaves


def _keys(tag: str, n: int) -> list[BlockHash]:
    return [BlockHash(hashlib.sha256(f"{tag}/{i}".encode()).digest()) for i in range(n)]


def _client(url: str, tag: str, ns: str, cmds: Connection) -> None:
    """One client process: stores its own batch, then runs rounds until told to stop."""
    clients = {"shm": KVStoreClient(url, use_shm=True, transport="unix"),
               "tcp": KVStoreClient(url, use_shm=False, transport="tcp")}
    keys = _keys(tag, BATCH)
    clients["tcp"].put(ns, keys, [os.urandom(BLOCK) for _ in keys])
    dest = [bytearray(BLOCK) for _ in keys]
    cmds.send("ready")
    while (cmd := cmds.recv()) is not None:
        op, mode, start_at, seconds, pace_s = cmd
        client = clients[mode]
        while time.time() < start_at:
            time.sleep(0.001)
        lat: list[float] = []
        moved = 0
        end = start_at + seconds
        n = 0
        while (now := time.time()) < end:
            if op == "get":
                t0 = time.perf_counter()
                if not all(client.get_into(ns, keys, dest)):
                    raise RuntimeError("many-clients bench: a get missed")
                moved += BLOCK * BATCH
            else:  # "put": fresh blocks, paced
                fresh = _keys(f"{tag}/put/{n}/{now}", PUT_BATCH)
                t0 = time.perf_counter()
                client.put(ns, fresh, [bytes(BLOCK)] * PUT_BATCH)
                moved += BLOCK * PUT_BATCH
            lat.append(time.perf_counter() - t0)
            n += 1
            if pace_s:
                time.sleep(max(0.0, pace_s - lat[-1]))
        cmds.send((moved, time.time() - start_at, lat))
    for c in clients.values():
        c.close()


class Clients:
    """``count`` client processes against ``srv``, each with a shared-memory and a TCP
    client; a round tells some of them what to run."""

    def __init__(self, srv: ServerProc, count: int, ns: str) -> None:
        ctx = mp.get_context("fork")  # the bench holds no threads here; spawn took 2 s a client
        self.pipes: list[Connection] = []
        self.procs = []
        for i in range(count):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_client, args=(srv.url, f"client/{i}", ns, theirs),
                               daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)
        for pipe in self.pipes:
            if pipe.recv() != "ready":
                raise RuntimeError("a bench client failed to start")

    def start(self, clients: range, op: str, mode: str, seconds: float,
              pace_s: float = 0.0) -> list[Connection]:
        """The chosen clients run ``op`` (``get`` or ``put``) over ``mode`` (``shm`` or
        ``tcp``) for ``seconds``, all from the same moment; collect with :meth:`collect`."""
        at = time.time() + START_S
        chosen = [self.pipes[i] for i in clients]
        for pipe in chosen:
            pipe.send((op, mode, at, seconds, pace_s))
        return chosen

    @staticmethod
    def collect(chosen: list[Connection]) -> tuple[float, list[float]]:
        """``(aggregate bytes per second, every op's latency)`` of a round."""
        results = [pipe.recv() for pipe in chosen]
        moved = sum(r[0] for r in results)
        span = max(r[1] for r in results)
        return moved / span, [x for r in results for x in r[2]]

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for proc in self.procs:
            proc.join(10)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def client_rows(srv: ServerProc, host_bytes: int, counts: list[int], seconds: float,
                reps: int) -> list[dict[str, Any]]:
    """Aggregate get GB/s and p99 with each number of clients over shm and TCP, then get p99
    alone and beside a client whose paced puts make the host tier demote (``srv`` has a
    host tier of ``host_bytes`` over a disk tier; it is filled first, so that every put
    beside the gets demotes as much as it brings)."""
    ns = "bench-clients"
    with KVStoreClient(srv.url) as c:
        c.register_namespace(ns, BLOCK, {"model_id": "bench"})
    pool = Clients(srv, max(*counts, 2), ns)
    try:
        rows = _scaling(pool, counts, seconds, reps)
        with KVStoreClient(srv.url, use_shm=False) as c:  # fill the host tier
            for i in range(host_bytes // (BLOCK * PUT_BATCH) + 1):
                c.put(ns, _keys(f"fill/{i}", PUT_BATCH), [bytes(BLOCK)] * PUT_BATCH)
        rows += _beside_demotion(pool, seconds, reps)
    finally:
        pool.close()
    with KVStoreClient(srv.url) as c:
        if not c.stats().tiers["host"].demotions:
            raise RuntimeError("many-clients bench: the puts never made the host tier demote")
    return rows


def _scaling(pool: Clients, counts: list[int], seconds: float,
             reps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for mode in ("shm", "tcp"):
        rates: dict[int, list[float]] = {n: [] for n in counts}
        lats: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(reps):  # interleaved: 1 2 4 8 1 2 4 8 ...
            for n in counts:
                rate, lat = pool.collect(pool.start(range(n), "get", mode, seconds))
                rates[n].append(rate)
                lats[n] += lat
        one = statistics.median(rates[counts[0]]) / 1e9
        for n in counts:
            rows.append(row(f"{mode} get, {n} clients", "GB/s",
                            statistics.median(rates[n]) / 1e9,
                            f"{mode} get, {counts[0]} client", one, higher_is_better=True,
                            target=0.9 if n == max(counts) and n > counts[0] else None,
                            block_bytes=BLOCK, clients=n))
            rows.append(row(f"{mode} get p99, {n} clients", "ms", 1e3 * p99(lats[n]),
                            higher_is_better=False, block_bytes=BLOCK, clients=n))
    return rows


def _beside_demotion(pool: Clients, seconds: float, reps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    reader, writer = range(0, 1), range(1, 2)
    for mode in ("shm", "tcp"):
        quiet: list[float] = []
        busy: list[float] = []
        for _ in range(reps + 1):  # alone, beside puts, alone, beside puts ...
            quiet += pool.collect(pool.start(reader, "get", mode, seconds))[1]
            puts = pool.start(writer, "put", "tcp", seconds, pace_s=PUT_PACE_S)
            busy += pool.collect(pool.start(reader, "get", mode, seconds))[1]
            pool.collect(puts)
        q, b = 1e3 * p99(quiet), 1e3 * p99(busy)
        rows.append(row(f"{mode} get p99 alone", "ms", q, higher_is_better=False,
                        block_bytes=BLOCK))
        rows.append(row(f"{mode} get p99 beside demoting puts", "ms", b,
                        f"{mode} get p99 alone", q, higher_is_better=False, target=0.5,
                        block_bytes=BLOCK))
    return rows
