"""Grouping's pure parts without a server: which blocks share an object, the layout of group
and pointer metadata, and the accounting and deletion rule of the holdings."""

from __future__ import annotations

import pytest

from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3.client import S3Settings
from kvstore.tiers.s3.grouping import cut
from kvstore.tiers.s3.holdings import Holdings
from kvstore.tiers.s3.layout import (
    Where,
    group_headers,
    parse_group,
    parse_head,
    pointer_headers,
)
from kvstore.types import BlockKey


def k(i: int, ns: str = "ns") -> BlockKey:
    return ns, bytes([i]) * 4


def m(size: int = 10, csum: int = 1) -> BlockMeta:
    return BlockMeta(7, csum, size)


def test_cut_keeps_order_and_splits_on_count_bytes_namespace_and_size() -> None:
    items = [(k(i), b"", m()) for i in range(5)]
    assert [[it[0] for it in g] for g in cut(items, 2, 1 << 20)] == [
        [k(0), k(1)], [k(2), k(3)], [k(4)]
    ]
    assert [len(g) for g in cut(items, 8, 25)] == [2, 2, 1]  # at most 25 bytes a group
    mixed = [(k(0), b"", m()), (k(1, "other"), b"", m()), (k(2), b"", m(11)), (k(3), b"", m(11))]
    assert [len(g) for g in cut(mixed, 8, 1 << 20)] == [1, 1, 2]
    assert cut([], 8, 1 << 20) == []


def test_group_pointer_and_single_heads_parse_to_meta_and_location() -> None:
    keys, metas = [k(1), k(2), k(3)], [m(10, 11), m(10, 12), m(10, 13)]
    headers = group_headers(k(1), keys, metas)
    assert parse_head(k(1), headers, 30) == (metas[0], Where(k(1), 0))
    assert parse_head(k(1), headers, 29) is None  # truncated
    assert parse_head(k(2), headers, 30) is None  # not this block's object
    group = parse_group(headers)
    assert group is not None and group.hashes == tuple(x[1] for x in keys)
    assert group.sums == (11, 12, 13) and group.size == 10
    pointer = pointer_headers(metas[2], Where(k(1), 2))
    assert parse_head(k(3), pointer, 0) == (metas[2], Where(k(1), 2))
    assert parse_head(k(3), pointer, 10) is None  # a pointer is empty
    single = group_headers(k(4), [k(4)], [m(10, 14)])
    assert "kv-members" not in single  # the one-object-per-block layout, unchanged
    assert parse_head(k(4), single, 10) == (m(10, 14), Where(k(4), 0))
    alias = (k(4)[0], k(4)[1] + b"\x00\x01")
    aliased = group_headers(alias, [k(4)], [m(10, 14)])
    assert parse_head(alias, aliased, 10) is None  # scans and discovery skip aliases


def test_holdings_charge_live_blocks_and_release_an_object_with_its_last_block() -> None:
    held = Holdings()
    for i in range(3):
        assert held.hold(k(i), m(), Where(k(0), i)) == []
    assert held.used == 30 and held.objects == 1
    assert held.forget(k(1)) == [] and held.forget(k(0)) == []
    assert held.used == 10 and held.dead_bytes == 20
    assert held.in_use(k(0))  # the object still serves block 2
    assert held.revivable(k(1), m(csum=2)) is None  # other bytes: not the stored ones
    assert held.revive(k(1), m())
    assert held.used == 20 and held.dead_bytes == 10
    assert held.forget(k(1)) == []
    assert held.forget(k(2)) == [k(0), k(1), k(2)]  # the group object and its pointers
    assert held.used == 0 and held.dead_bytes == 0 and held.objects == 0
    assert not held.revive(k(1), m())


def test_holdings_lose_a_replaced_object_without_deleting_it() -> None:
    held = Holdings()
    held.hold(k(0), m(), Where(k(0), 0))
    held.hold(k(1), m(), Where(k(0), 1))
    held.forget(k(0))
    assert sorted(held.lose(k(0))) == [k(1)]
    assert held.used == 0 and held.dead_bytes == 0 and len(held) == 0
    # another block at a known slot means the object changed: the old record goes
    held.hold(k(1), m(), Where(k(0), 1))
    held.hold(k(2), m(), Where(k(0), 2))
    held.hold(k(5), m(), Where(k(0), 1))
    assert not held.get(k(1)) and not held.get(k(2)) and held.where(k(5)) == Where(k(0), 1)
    assert held.used == 10


def test_group_settings_are_validated() -> None:
    assert S3Settings(bucket="b").group_blocks == 8
    for bad in (0, 17):
        with pytest.raises(ValueError, match="group_blocks"):
            S3Settings(bucket="b", group_blocks=bad)
    with pytest.raises(ValueError, match="group_bytes"):
        S3Settings(bucket="b", group_bytes=0)


def test_holdings_name_a_group_s_live_members_and_its_dead_share() -> None:
    held = Holdings()
    for i in range(4):
        held.hold(k(i), m(), Where(k(0), i))
    assert held.group_of(k(2)) == k(0) and held.group_of(k(9)) is None
    assert held.dead_share(k(0)) == 0.0
    held.forget(k(1))
    held.forget(k(3))
    assert held.group_of(k(1)) is None
    assert held.live_members(k(0)) == [(0, k(0), m()), (2, k(2), m())]
    assert held.dead_share(k(0)) == 0.5
    held.forget(k(0))
    assert held.dead_share(k(0)) == 0.75
    assert held.live_members(k(5)) == [] and held.dead_share(k(5)) == 0.0
