"""A damaged page in the disk tier's LMDB file costs only the keys on it, through a real
``kvstore serve``: a data-plane get of a 256-block batch that holds the damaged key returns
every other block byte-identical and a miss for that one (it used to answer ``unavailable``
for the whole batch, on every try), a delete of it succeeds, and the stats count it as
corrupt with its cause."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kvstore.client import KVStoreClient
from kvstore.testing.lmdb_pages import damage_value, leaves
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash

N = 256  # one full get batch
BLOCK = 64 << 10
BAD = 100


def h(i: int) -> BlockHash:
    return BlockHash(hashlib.sha256(b"disk-damage:%d" % i).digest())


def stored_key(data_mdb: Path, block_hash: bytes) -> bytes:
    """The LMDB key the server stored ``block_hash`` under (its namespace prefix is the
    server's business: found by the hash it ends with)."""
    (raw,) = [k for leaf in leaves(data_mdb.read_bytes()) for k, _ in leaf.keys
              if k.endswith(block_hash)]
    return raw


def test_a_damaged_page_fails_only_its_block_over_the_data_plane(tmp_path: Path) -> None:
    hashes = [h(i) for i in range(N)]
    blocks = [os.urandom(BLOCK) for _ in range(N)]
    srv = ServerProc(tmp_path / "data", host_capacity="64MiB", disk_capacity="256MiB").start()
    try:
        with KVStoreClient(srv.url, use_shm=False) as c:
            c.register_namespace("damaged", BLOCK, {})
            assert c.put("damaged", hashes, blocks, durable=True).stored == N
        srv.stop()  # every block is in the file now (durable puts, and the spill at stop)
        damage_value(tmp_path / "data" / "lmdb" / "data.mdb",
                     stored_key(tmp_path / "data" / "lmdb" / "data.mdb", hashes[BAD]))
        srv.start()
        with KVStoreClient(srv.url, use_shm=False) as c:
            want = [None if i == BAD else b for i, b in enumerate(blocks)]
            for _ in range(2):  # not once: every try used to fail the same way
                got = c.get("damaged", hashes)  # one batch over the data plane
                assert [g is None for g in got] == [w is None for w in want]
                assert got == want  # the others byte-identical
            assert c.delete("damaged", [hashes[BAD]]) == 0  # no error: it was already gone
            assert c.get("damaged", hashes[BAD - 1:BAD + 2]) == want[BAD - 1:BAD + 2]
            disk = c.stats().tiers["disk"]
            assert disk.corrupt_dropped == 1
            assert disk.corrupt_by_cause == {"disk_page": 1}
    finally:
        srv.stop()
