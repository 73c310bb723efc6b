"""The contract every tier meets, run against each one.

Subclass :class:`TierContract` in a ``Test*`` class and implement :meth:`make_tier`; add only
the tier's own cases beside it. The tests use ``tier.charge(size)`` for accounting so that slot
tiers (which round up) and byte tiers pass the same assertions.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from kvstore.checksum import checksum
from kvstore.errors import CapacityError
from kvstore.tiers.base import BlockMeta, Tier
from kvstore.types import BlockKey

KiB = 1 << 10


def key(i: int, ns: str = "ns") -> BlockKey:
    """A distinct key per ``i``; hashes contain NUL bytes on purpose."""
    return ns, i.to_bytes(4, "big") + b"\x00hash"


def block(size: int) -> bytes:
    return os.urandom(size)


def item(k: BlockKey, data: bytes, layout_id: int = 7) -> tuple[BlockKey, bytes, BlockMeta]:
    return k, data, BlockMeta(layout_id, checksum(data), len(data))


class TierContract:
    """Behaviour shared by every :class:`~kvstore.tiers.base.Tier`."""

    capacity = 4 << 20  # bytes given to make_tier by the ``tier`` fixture
    sizes = (1, 1000, 64 * KiB - 1, 64 * KiB, 64 * KiB + 1, 200 * KiB)

    def make_tier(self, capacity: int) -> Tier:
        raise NotImplementedError

    @pytest.fixture
    def tier(self) -> Iterator[Tier]:
        t = self.make_tier(self.capacity)
        yield t
        t.close()

    def test_round_trip_is_byte_identical(self, tier: Tier) -> None:
        blocks = {key(i): block(n) for i, n in enumerate(self.sizes)}
        tier.put_many([item(k, v) for k, v in blocks.items()])
        got = tier.get_many(list(blocks))
        for (k, want), have in zip(blocks.items(), got, strict=True):
            assert type(have) is bytes, k
            assert have == want, k

    def test_accepts_bytearray_and_memoryview(self, tier: Tier) -> None:
        data = block(70 * KiB)
        backing = bytearray(b"\xff" * 8 + data + b"\xff" * 8)
        tier.put_many(
            [
                (key(1), bytearray(data), BlockMeta(1, checksum(data), len(data))),
                (key(2), memoryview(backing)[8:-8], BlockMeta(1, checksum(data), len(data))),
            ]
        )
        assert tier.get_many([key(1), key(2)]) == [data, data]

    def test_input_buffers_are_only_read_during_the_call(self, tier: Tier) -> None:
        buf = bytearray(block(3000))
        want = bytes(buf)
        tier.put_many([item(key(1), buf)])  # type: ignore[arg-type]
        buf[:] = b"\x00" * len(buf)
        assert tier.get_many([key(1)]) == [want]

    def test_returned_bytes_are_owned_by_the_caller(self, tier: Tier) -> None:
        first = block(5000)
        tier.put_many([item(key(1), first)])
        (got,) = tier.get_many([key(1)])
        tier.put_many([item(key(1), block(5000))])
        tier.put_many([item(key(2), block(5000))])
        assert got == first

    def test_get_absent_keys_gives_none_in_order(self, tier: Tier) -> None:
        data = block(100)
        tier.put_many([item(key(2), data)])
        assert tier.get_many([key(1), key(2), key(3), ("other", key(2)[1])]) == [
            None,
            data,
            None,
            None,
        ]
        assert tier.get_many([]) == []

    def test_contains(self, tier: Tier) -> None:
        assert not tier.contains(key(1))
        tier.put_many([item(key(1), block(10))])
        assert tier.contains(key(1))
        assert not tier.contains(key(2))
        assert not tier.contains(("other-ns", key(1)[1]))

    def test_overwrite_replaces_bytes_and_accounting(self, tier: Tier) -> None:
        tier.put_many([item(key(1), block(150 * KiB))])
        new = block(10 * KiB)
        tier.put_many([item(key(1), new)])
        assert tier.get_many([key(1)]) == [new]
        assert tier.used_bytes() == tier.charge(len(new))

    def test_same_key_twice_in_one_batch_keeps_the_last(self, tier: Tier) -> None:
        last = block(2000)
        tier.put_many([item(key(1), block(3000)), item(key(1), last)])
        assert tier.get_many([key(1)]) == [last]
        assert tier.used_bytes() == tier.charge(len(last))

    def test_delete(self, tier: Tier) -> None:
        blocks = {key(i): block(40 * KiB) for i in range(4)}
        tier.put_many([item(k, v) for k, v in blocks.items()])
        tier.delete([key(1), key(3), key(99)])  # key(99) is absent: ignored
        assert [tier.contains(k) for k in blocks] == [True, False, True, False]
        assert tier.get_many(list(blocks)) == [blocks[key(0)], None, blocks[key(2)], None]
        assert tier.used_bytes() == 2 * tier.charge(40 * KiB)
        tier.delete([key(0), key(2)])
        assert tier.used_bytes() == 0

    def test_used_bytes_counts_every_block(self, tier: Tier) -> None:
        assert tier.used_bytes() == 0
        tier.put_many([item(key(i), block(n)) for i, n in enumerate(self.sizes)])
        assert tier.used_bytes() == sum(tier.charge(n) for n in self.sizes)
        assert all(tier.charge(n) >= n for n in self.sizes)

    def test_charges_of_a_batch_are_each_charge(self, tier: Tier) -> None:
        sizes = [0, 1, *self.sizes]
        assert tier.charges(sizes) == [tier.charge(n) for n in sizes]
        assert tier.charges([]) == []

    def test_full_tier_refuses_and_stores_nothing_of_the_batch(self) -> None:
        tier = self.make_tier(self.capacity)
        try:
            size = 64 * KiB
            n = tier.capacity_bytes // tier.charge(size)
            tier.put_many([item(key(i), block(size)) for i in range(n)])
            assert tier.used_bytes() <= tier.capacity_bytes
            before = tier.used_bytes()
            batch = [item(key(1000 + i), block(size)) for i in range(2)]
            with pytest.raises(CapacityError):
                tier.put_many(batch)
            assert tier.used_bytes() == before
            assert not any(tier.contains(k) for k, _, _ in batch)
            # Overwriting a stored key in place still fits: its old bytes make room.
            same = block(size)
            tier.put_many([item(key(0), same)])
            assert tier.get_many([key(0)]) == [same]
            assert tier.used_bytes() == before <= tier.capacity_bytes
        finally:
            tier.close()

    def test_refused_overwrite_keeps_the_old_bytes(self, tier: Tier) -> None:
        old = block(64 * KiB)
        tier.put_many([item(key(1), old)])
        before = tier.used_bytes()
        too_big = [item(key(1), block(64 * KiB)), item(key(2), block(tier.capacity_bytes))]
        with pytest.raises(CapacityError):
            tier.put_many(too_big)
        assert tier.get_many([key(1), key(2)]) == [old, None]
        assert tier.used_bytes() == before

    def test_block_larger_than_capacity_is_refused(self, tier: Tier) -> None:
        size = tier.capacity_bytes + 1
        assert not tier.fits(size)
        with pytest.raises(CapacityError):
            tier.put_many([item(key(1), block(size))])
        assert tier.used_bytes() == 0
        assert not tier.contains(key(1))

    def test_close_is_idempotent(self) -> None:
        tier = self.make_tier(self.capacity)
        tier.put_many([item(key(1), block(100))])
        tier.close()
        tier.close()

    def test_health_reports_ok(self, tier: Tier) -> None:
        assert tier.health()["ok"] is True

    def test_threads_on_disjoint_keys(self, tier: Tier) -> None:
        errors: list[BaseException] = []

        def worker(w: int) -> None:
            try:
                for r in range(10):
                    keys = [key(w * 1000 + r * 10 + j, ns=f"t{w}") for j in range(3)]
                    data = [block(17 * KiB + w * 100 + j) for j in range(3)]
                    tier.put_many([item(k, d) for k, d in zip(keys, data, strict=True)])
                    assert tier.get_many(keys) == data
                    tier.delete(keys[:2])
                    assert tier.get_many(keys[:2]) == [None, None]
            except BaseException as exc:  # surfaced in the main thread below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        left = sum(tier.charge(17 * KiB + w * 100 + 2) for w in range(4)) * 10
        assert tier.used_bytes() == left
