"""Disk tier over a real LMDB file with damaged pages: a damaged page costs only the keys on it
(reads, deletes and puts of the rest of a batch go on), the keys are reported once with their
cause, and health shows what was found."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvstore.testing.lmdb_pages import damage_leaf, damage_value, leaves
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.disk.records import encode_key
from tests.kvstore.tiers.contract import KiB, block, item, key

N = 256  # one get batch of the data plane
SIZE = 16 * KiB  # over a quarter page: each value has its own overflow pages
BAD = 100


@pytest.fixture
def blocks() -> list[bytes]:
    return [block(SIZE) for _ in range(N)]


def written(path: Path, blocks: list[bytes]) -> Path:
    """``blocks`` stored as keys 0..N-1 by the disk tier, the tier closed; its data file."""
    tier = DiskTier(64 << 20, path=str(path))
    tier.put_many([item(key(i), data) for i, data in enumerate(blocks)])
    tier.close()
    return path / "data.mdb"


def test_a_damaged_value_page_costs_only_its_key(tmp_path: Path, blocks: list[bytes]) -> None:
    damage_value(written(tmp_path / "db", blocks), encode_key(key(BAD)))
    tier = DiskTier(64 << 20, path=str(tmp_path / "db"))
    try:
        want = [None if i == BAD else data for i, data in enumerate(blocks)]
        assert tier.get_many([key(i) for i in range(N)]) == want  # byte-identical, one miss
        assert tier.take_damaged() == [(key(BAD), "disk_page")]
        assert len(tier) == N - 1 and tier.used_bytes() == (N - 1) * SIZE  # counted out
        # again: a miss without asking LMDB, reported once
        assert tier.get_many([key(i) for i in range(N)]) == want
        assert tier.take_damaged() == []
        assert tier.metas([key(BAD), key(BAD + 1)])[0] is None
        assert tier.metas([key(BAD + 1)])[0] is not None
        assert not tier.contains(key(BAD))
        assert tier.leading("ns", [key(i)[1] for i in range(N)]) == BAD  # the run ends there
        # LMDB cannot delete it (it must read the page); the rest of the delete goes on
        tier.delete([key(BAD), key(BAD + 1)])
        assert tier.get_many([key(BAD), key(BAD + 1), key(BAD + 2)]) == [None, None,
                                                                        blocks[BAD + 2]]
        # a put over it cannot land; the rest of the batch does
        tier.put_many([item(key(BAD), block(SIZE)), item(key(N), block(SIZE))])
        assert tier.get_many([key(BAD)]) == [None]
        assert tier.contains(key(N))
        assert sorted(tier.keys_of("ns")) == sorted(
            key(i) for i in range(N + 1) if i not in (BAD, BAD + 1))
        assert len(tier.sample(8, random.Random(1))) > 0
        health = tier.health()
        assert health["ok"] is True
        assert health["damage"]["found"] == 1
        assert health["damage"]["by_cause"] == {"disk_page": 1}
        assert health["damage"]["remembered"] == 1
        assert "MDB_CORRUPTED" in health["damage"]["last_error"]
        assert tier.stats()["damage"] == health["damage"]
    finally:
        tier.close()


def test_a_damaged_key_is_found_again_after_a_restart(
    tmp_path: Path, blocks: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    damage_value(written(tmp_path / "db", blocks), encode_key(key(BAD)))
    for _ in range(2):  # the set of damaged keys is in memory: each open finds it once
        caplog.clear()
        tier = DiskTier(64 << 20, path=str(tmp_path / "db"))
        try:
            for _ in range(3):
                got = tier.get_many([key(i) for i in range(N)])
                assert got[BAD] is None and got[BAD + 1] == blocks[BAD + 1]
            assert tier.take_damaged() == [(key(BAD), "disk_page")]
        finally:
            tier.close()
        assert sum("is damaged" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_a_damaged_leaf_costs_only_the_keys_on_it(tmp_path: Path, blocks: list[bytes]) -> None:
    lost = {raw for raw in damage_leaf(written(tmp_path / "db", blocks), encode_key(key(BAD)))}
    assert 0 < len(lost) < N // 2
    tier = DiskTier(64 << 20, path=str(tmp_path / "db"))
    try:
        got = tier.get_many([key(i) for i in range(N)])
        for i, data in enumerate(got):
            assert data == (None if encode_key(key(i)) in lost else blocks[i])
        assert {encode_key(k) for k, _ in tier.take_damaged()} == lost
        # a listing goes around the damaged page (a cursor cannot step over it)
        assert {encode_key(k) for k in tier.keys_of("ns")} == {
            encode_key(key(i)) for i in range(N)} - lost
        # LMDB cannot delete the keys of a leaf beside the damaged one either once it would
        # merge the two: those read as deleted from then on, counted apart
        tier.delete([key(i) for i in range(N)])
        assert tier.get_many([key(i) for i in range(N)]) == [None] * N
        assert len(tier) == 0 and tier.used_bytes() == 0  # what is left is out of reach
        causes = tier.health()["damage"]["by_cause"]
        assert causes["disk_page"] == len(lost)
        assert set(causes) <= {"disk_page", "disk_write"}
        assert {encode_key(k) for k, _ in tier.take_damaged()} == set()  # none lost: deleted
    finally:
        tier.close()


def test_a_put_into_a_damaged_leaf_stores_the_rest(tmp_path: Path, blocks: list[bytes]) -> None:
    data_mdb = written(tmp_path / "db", blocks)
    on_leaf = damage_leaf(data_mdb, encode_key(key(BAD)))
    # a new key that sorts between two keys of the damaged leaf goes into that page
    new = ("ns", on_leaf[1][len(b"ns\x00"):] + b"\x01")
    assert encode_key(new) not in on_leaf
    tier = DiskTier(64 << 20, path=str(tmp_path / "db"))
    try:
        fresh = block(SIZE)
        tier.put_many([item(new, block(SIZE)), item(key(N), fresh)])  # never raises for it
        assert tier.get_many([new, key(N)]) == [None, fresh]
        assert (new, "disk_page") in tier.take_damaged()
    finally:
        tier.close()


def test_the_page_walk_finds_every_key(tmp_path: Path, blocks: list[bytes]) -> None:
    """The fixture's reading of the file: every stored key, each value on its own pages."""
    found = [k for leaf in leaves(written(tmp_path / "db", blocks).read_bytes())
             for k, big in leaf.keys if big is not None]
    assert sorted(found) == sorted(encode_key(key(i)) for i in range(N))
