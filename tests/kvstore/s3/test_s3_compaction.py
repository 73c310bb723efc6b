"""Compaction against a real SeaweedFS: a group object whose deleted members take more than
``compact_dead_share`` of it is rewritten with its live members only, which stay readable by
this node and by another one, byte for byte; the old object and the dead pointers go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstore.testing.seaweed import SeaweedServer
from kvstore.tiers.s3 import S3Tier
from tests.kvstore.s3.test_s3_groups import SIZE, listed, put_chain
from tests.kvstore.tiers.contract import block, item, key

MakeTier = Callable[..., S3Tier]


def test_a_mostly_dead_group_is_rewritten_without_its_dead_members(
    make_tier: MakeTier, seaweed: SeaweedServer
) -> None:
    tier = make_tier(group_blocks=8)
    blocks = put_chain(tier, 8)
    tier.delete([key(i) for i in (0, 1, 2, 4, 5)])  # 5 of 8 dead: above the 0.5 default
    tier.flush()
    stats = tier.stats()
    assert stats["compactions"] == 1 and stats["dead_bytes"] == 0
    assert stats["used_bytes"] == 3 * SIZE and stats["objects"] == 1
    objects = listed(tier, seaweed)
    assert sorted(objects) == sorted(key(i)[1].hex() for i in (3, 6, 7))  # dead pointers gone
    assert sum(objects.values()) == 3 * SIZE  # the bucket holds the live bytes only
    live = [key(i) for i in (3, 6, 7)]
    assert tier.get_many(live) == [blocks[k] for k in live]
    other = make_tier()  # another node finds each survivor from its key alone
    assert other.discover(live) == [item(k, blocks[k])[2] for k in live]
    assert other.get_many(live) == [blocks[k] for k in live]
    assert other.discover([key(0)]) == [None]


def test_a_group_whose_first_block_lives_is_rewritten_in_place(
    make_tier: MakeTier, seaweed: SeaweedServer
) -> None:
    tier = make_tier(group_blocks=4)
    blocks = put_chain(tier, 4)
    tier.delete([key(1), key(2), key(3)])
    tier.flush()
    assert tier.stats()["compactions"] == 1
    assert listed(tier, seaweed) == {key(0)[1].hex(): SIZE}  # key(0) alone, at its own name
    assert tier.get_many([key(0)]) == [blocks[key(0)]]
    other = make_tier()
    assert other.get_many([key(0)]) == [None] and other.discover([key(0)]) != [None]
    assert other.get_many([key(0)]) == [blocks[key(0)]]
    tier.delete([key(0)])
    tier.flush()
    assert listed(tier, seaweed) == {} and tier.stats()["used_bytes"] == 0


def test_a_group_at_or_below_the_bound_keeps_its_dead_members(make_tier: MakeTier) -> None:
    tier = make_tier(group_blocks=4)
    blocks = put_chain(tier, 4)
    tier.delete([key(1), key(2)])  # exactly half: not above the bound
    tier.flush()
    stats = tier.stats()
    assert stats["compactions"] == 0 and stats["dead_bytes"] == 2 * SIZE
    tier.put_many([item(key(1), blocks[key(1)])])  # revived in place: still possible
    tier.flush()
    assert tier.stats()["dead_bytes"] == SIZE
    assert tier.get_many([key(0), key(1), key(3)]) == [blocks[key(i)] for i in (0, 1, 3)]


def test_a_block_put_again_with_other_bytes_counts_its_old_copy_dead(
    make_tier: MakeTier,
) -> None:
    tier = make_tier(group_blocks=4)
    blocks = put_chain(tier, 4)
    new = {key(i): block(SIZE) for i in (1, 2, 3)}  # the same keys, other bytes: a new group
    tier.put_many([item(k, v) for k, v in new.items()])
    tier.flush()
    assert tier.stats()["compactions"] == 1 and tier.stats()["dead_bytes"] == 0
    assert tier.get_many([key(0), *new]) == [blocks[key(0)], *new.values()]


def test_a_block_deleted_while_its_group_is_read_back_stays_deleted(
    make_tier: MakeTier, seaweed: SeaweedServer
) -> None:
    tier = make_tier(group_blocks=8)
    blocks = put_chain(tier, 8)

    def delete_during_read(**_: Any) -> None:  # the compaction's ranged GET, outside the lock
        tier.client.meta.events.unregister("before-send.s3.GetObject", delete_during_read)
        tier.delete([key(6)])

    tier.client.meta.events.register("before-send.s3.GetObject", delete_during_read)
    tier.delete([key(i) for i in range(5)])
    tier.flush()
    assert tier.stats()["compactions"] == 1
    assert not tier.contains(key(6)) and tier.get_many([key(6)]) == [None]
    assert tier.get_many([key(5), key(7)]) == [blocks[key(5)], blocks[key(7)]]
    assert tier.used_bytes() == 2 * SIZE
    assert sorted(listed(tier, seaweed)) == sorted(key(i)[1].hex() for i in (5, 7))
