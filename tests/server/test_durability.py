"""Crashes and shutdowns: ``kill -9`` during durable puts, graceful SIGTERM, leases of dead
clients."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import threading
import time

from kvstore.client import KVStoreClient
from kvstore.types import PutResult

BLOCK = 64 << 10


def h(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def blk(i: int) -> bytes:
    return hashlib.sha512(str(i).encode()).digest() * (BLOCK // 64)


def test_kill_9_keeps_every_durably_acknowledged_block(make_server, ns_name) -> None:
    srv = make_server()
    acked: list[int] = []
    attempted: list[int] = []
    stop = threading.Event()

    def writer() -> None:
        with KVStoreClient(srv.url, timeout=5) as c:
            c.register_namespace(ns_name, BLOCK, {})
            i = 0
            while not stop.is_set():
                batch = list(range(i, i + 4))
                attempted.extend(batch)
                try:
                    r = c.put(ns_name, [h(j) for j in batch], [blk(j) for j in batch],
                              durable=True)
                except ConnectionError:
                    return
                assert r.stored + r.existing == 4, r
                acked.extend(batch)
                i += 4

    t = threading.Thread(target=writer)
    t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    srv.kill()  # SIGKILL mid-stream: no shutdown code runs
    stop.set()
    t.join(30)
    assert len(acked) >= 40
    srv.start()  # same folder, same ports; the stale shm segment is reclaimed
    with KVStoreClient(srv.url) as c:
        got = c.get(ns_name, [h(i) for i in acked])
        assert all(g == blk(i) for g, i in zip(got, acked, strict=True)), "acked block lost"
        rest = [i for i in attempted if i not in set(acked)]
        for g, i in zip(c.get(ns_name, [h(i) for i in rest]), rest, strict=True):
            assert g is None or g == blk(i)  # never a torn or corrupt block


def test_sigterm_finishes_in_flight_puts_and_syncs(make_server, ns_name) -> None:
    srv = make_server()
    with KVStoreClient(srv.url) as c:
        c.register_namespace(ns_name, BLOCK, {})
        assert c.put(ns_name, [h(i) for i in range(50)], [blk(i) for i in range(50)]).stored
    results: list[object] = []
    connected = threading.Event()
    many = range(50, 1050)  # 64 MiB in one frame: still being stored when SIGTERM lands

    def big_put() -> None:
        with KVStoreClient(srv.url, use_shm=False) as c:
            c.lookup(ns_name, [h(0)])  # connected; the next frame is the big one
            connected.set()
            try:
                results.append(c.put(ns_name, [h(i) for i in many], [blk(i) for i in many]))
            except ConnectionError as exc:  # refused before it started: also clean
                results.append(exc)

    t = threading.Thread(target=big_put)
    t.start()
    assert connected.wait(60)
    time.sleep(0.05)
    assert srv.stop() == 0  # SIGTERM: exits cleanly
    t.join(30)
    srv.start()
    with KVStoreClient(srv.url) as c:
        assert c.lookup(ns_name, [h(0)])[1] == ["disk"]  # spilled to LMDB at shutdown
        assert c.get(ns_name, [h(i) for i in range(50)]) == [blk(i) for i in range(50)]
        if isinstance(results[0], PutResult):  # acknowledged: it must have survived
            assert results[0].stored == len(many)
            got = c.get(ns_name, [h(i) for i in many])
            assert got == [blk(i) for i in many]
    assert "Traceback" not in srv.log()


def test_pins_of_a_dead_client_go(server, ns_name) -> None:
    with KVStoreClient(server.url) as c:
        c.register_namespace(ns_name, BLOCK, {})
        c.put(ns_name, [h(1), h(2)], [blk(1), blk(2)])
        before = c.stats().totals.pinned
    script = textwrap.dedent(f"""
        import sys, time
        from kvstore.client import KVStoreClient
        c = KVStoreClient({server.url!r})
        assert c.pin({ns_name!r}, [bytes.fromhex({h(1).hex()!r}),
                                    bytes.fromhex({h(2).hex()!r})], lease_s=600) == [True, True]
        print("pinned", flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"pinned"
        with KVStoreClient(server.url) as c:
            assert c.stats().totals.pinned == before + 2
            child.kill()
            child.wait()
            deadline = time.monotonic() + 15
            while c.stats().totals.pinned != before and time.monotonic() < deadline:
                time.sleep(0.2)
            assert c.stats().totals.pinned == before
    finally:
        child.kill()


def test_leases_expire_while_connected(server, ns_name) -> None:
    with KVStoreClient(server.url) as c, KVStoreClient(server.url) as watcher:
        c.register_namespace(ns_name, BLOCK, {})
        c.put(ns_name, [h(3)], [blk(3)])
        before = watcher.stats().totals.pinned
        assert c.pin(ns_name, [h(3)], lease_s=1.0) == [True]
        assert watcher.stats().totals.pinned == before + 1
        deadline = time.monotonic() + 15
        while watcher.stats().totals.pinned != before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert watcher.stats().totals.pinned == before
        assert c.lookup(ns_name, [h(3)])[0] == 1  # the block stays; only the pin went
