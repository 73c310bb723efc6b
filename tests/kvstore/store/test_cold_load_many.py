"""The cold index loads the entries of a batch with one read per cold tier, and they are the
entries a load of each key gives: misses, another layout, a key given twice, held entries."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kvstore.store.cold import ColdIndex
from kvstore.store.index import Entry
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.disk import DiskTier
from kvstore.types import BlockKey

LAYOUT = 7


class CountingDisk(DiskTier):
    """A disk tier that counts its ``metas`` calls (each one is a read transaction)."""

    metas_calls = 0

    def metas(self, keys: Sequence[BlockKey]) -> list[BlockMeta | None]:
        self.metas_calls += 1
        return super().metas(keys)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[CountingDisk]:
    tier = CountingDisk(1 << 20, path=str(tmp_path / "db"))
    tier.put_many([(("m", b"h%d" % i), b"x" * (10 + i), BlockMeta(LAYOUT, 100 + i, 10 + i))
                   for i in range(6)])
    tier.put_many([(("old", b"h0"), b"y", BlockMeta(LAYOUT + 1, 1, 1))])
    yield tier
    tier.close()


def cold_over(tier: DiskTier) -> ColdIndex:
    return ColdIndex([(1, tier)], lambda ns: {"m": LAYOUT, "old": LAYOUT}.get(ns))


KEYS = [("m", b"h3"), ("m", b"absent"), ("m", b"h0"), ("old", b"h0"), ("m", b"h3"),
        ("nobody", b"h1"), ("m", b"h5")]


def fields(entry: Entry | None) -> tuple[int, int | None, int, int] | None:
    return None if entry is None else (entry.size, entry.checksum, entry.layout_id, entry.tiers)


def test_a_batch_loads_what_each_key_loads_in_one_read(disk: CountingDisk) -> None:
    batched = cold_over(disk).load_many(KEYS)
    assert disk.metas_calls == 1
    one_by_one = cold_over(disk)
    singles = [one_by_one.load(k) for k in KEYS]
    assert [fields(e) for e in batched] == [fields(e) for e in singles]
    assert [fields(e) for e in batched] == [
        (13, 103, LAYOUT, 0b10), None, (10, 100, LAYOUT, 0b10),
        None,  # stored under another layout: not the namespace's
        (13, 103, LAYOUT, 0b10), None, (15, 105, LAYOUT, 0b10)]
    assert batched[0] is batched[4]  # a key given twice: one entry


def test_held_entries_are_returned_without_asking_the_tier(disk: CountingDisk) -> None:
    cold = cold_over(disk)
    first = cold.load_many(KEYS)
    calls = disk.metas_calls
    again = cold.load_many([("m", b"h0"), ("m", b"h3")])
    assert again[0] is first[2] and again[1] is first[0]
    assert disk.metas_calls == calls  # every key answered by a held entry
    assert cold.load(("m", b"h5")) is first[6]
    mine = Entry(1, 2, LAYOUT, 0b10)
    cold.hold(("m", b"h1"), mine)
    assert cold.load_many([("m", b"h1"), ("m", b"h2")])[0] is mine
    assert disk.metas_calls == calls + 1  # only h2 was asked for


def test_no_cold_tier_loads_nothing() -> None:
    assert ColdIndex([], lambda _: None).load_many(KEYS) == [None] * len(KEYS)
