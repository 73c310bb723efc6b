"""A damaged page of the disk tier's LMDB file, seen through the store: the rest of a get
batch is served byte-identical, the block on the page is a counted corrupt miss (cause
``disk_page``), later reads and a delete of it go on, and stats and health report it."""

from __future__ import annotations

from pathlib import Path

from kvstore.testing.lmdb_pages import damage_value
from kvstore.types import BlockHash

from .conftest import StoreFactory, blocks

N = 256
BAD = 100


def test_a_damaged_page_costs_the_store_only_its_block(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    store = make_store(host=2, disk=N + 16)
    raw, data = blocks(N)
    hashes = [BlockHash(h) for h in raw]
    store.put("m", hashes, data)
    store.close()  # spills what the host tier held: every block is on disk
    damage_value(tmp_path / "lmdb" / "data.mdb", b"m\x00" + hashes[BAD])

    again = make_store(host=2, disk=N + 16, register=False)
    want = [None if i == BAD else d for i, d in enumerate(data)]
    assert again.get("m", hashes) == want  # not an error for the whole batch
    stats = again.stats()
    assert stats.totals.corrupt_dropped == 1
    assert stats.tiers["disk"].corrupt_dropped == 1
    assert stats.tiers["disk"].corrupt_by_cause == {"disk_page": 1}
    assert stats.namespaces["m"].corrupt_dropped == 1
    assert stats.tiers["disk"].backend["damage"]["found"] == 1

    assert again.get("m", hashes) == want  # a second read: the same, counted once
    assert again.stats().tiers["disk"].corrupt_by_cause == {"disk_page": 1}
    assert not again.contains("m", hashes[BAD])
    assert again.lookup("m", hashes).prefix_blocks == BAD
    again.delete("m", [hashes[BAD], hashes[BAD + 1]])  # does not raise
    assert again.get("m", hashes[BAD:BAD + 3]) == [None, None, data[BAD + 2]]

    health = again.health()
    assert health.ok is True  # the rest of the file serves
    damage = health.doc()["tiers"]["disk"]["damage"]  # the disk tier's own report
    assert damage["by_cause"] == {"disk_page": 1}
    assert "MDB_CORRUPTED" in damage["last_error"]
    again.check_integrity()
