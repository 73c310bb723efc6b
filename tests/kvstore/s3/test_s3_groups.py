"""Grouped objects against a real SeaweedFS: runs of consecutive blocks share one object,
every block is still found and verified alone, a chain reads with one ranged GET per group,
and the deletion rule (an object goes when its last live block does) keeps accounting right."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.awsrequest import AWSResponse

from kvstore.testing.seaweed import SeaweedServer
from kvstore.tiers.s3 import S3Tier
from tests.kvstore.s3.faults import Faults
from tests.kvstore.s3.test_s3_sharing import count_requests
from tests.kvstore.tiers.contract import KiB, block, item, key

MakeTier = Callable[..., S3Tier]
SIZE = 16 * KiB


def listed(tier: S3Tier, seaweed: SeaweedServer) -> dict[str, int]:
    """Object name (last part) -> length, under the tier's prefix."""
    resp = seaweed.client().list_objects_v2(Bucket=seaweed.bucket, Prefix=tier.settings.key_prefix)
    return {o["Key"].rsplit("/", 1)[1]: o["Size"] for o in resp.get("Contents", [])}


def put_chain(tier: S3Tier, n: int, first: int = 0) -> dict:  # type: ignore[type-arg]
    blocks = {key(first + i): block(SIZE) for i in range(n)}
    tier.put_many([item(k, v) for k, v in blocks.items()])
    tier.flush()
    return blocks


def test_a_run_of_blocks_is_one_object_plus_a_pointer_per_other_block(
    make_tier: MakeTier, seaweed: SeaweedServer
) -> None:
    tier = make_tier(group_blocks=4)
    put_chain(tier, 6)
    objects = listed(tier, seaweed)
    assert objects[key(0)[1].hex()] == 4 * SIZE  # blocks 0-3
    assert objects[key(4)[1].hex()] == 2 * SIZE  # blocks 4-5
    assert sorted(objects) == sorted(key(i)[1].hex() for i in range(6))
    assert {objects[key(i)[1].hex()] for i in (1, 2, 3, 5)} == {0}  # pointers are empty
    head = seaweed.client().head_object(
        Bucket=seaweed.bucket, Key=f"{tier.settings.key_prefix}ns/{key(2)[1].hex()}"
    )
    assert head["Metadata"]["kv-group"] == key(0)[1].hex()
    assert head["Metadata"]["kv-index"] == "2"
    assert tier.stats()["objects"] == 2 and tier.health()["uploaded"] == 6


def test_a_chain_reads_with_one_ranged_get_per_group(make_tier: MakeTier) -> None:
    writer = make_tier()
    blocks = put_chain(writer, 16)
    reader = make_tier()
    assert all(m is not None for m in reader.discover(list(blocks), prefix=True))
    gets = count_requests(reader, "GetObject")
    assert reader.get_many(list(blocks)) == list(blocks.values())
    assert gets[0] == 2  # 16 blocks, 8 per object
    assert reader.get_many([key(5), key(6)]) == [blocks[key(5)], blocks[key(6)]]
    assert gets[0] == 3  # neighbours of one group: one ranged GET


def test_any_block_is_found_and_read_alone_by_another_node(make_tier: MakeTier) -> None:
    writer = make_tier()
    blocks = put_chain(writer, 8)
    reader = make_tier()
    gets = count_requests(reader, "GetObject")
    assert reader.discover([key(5)]) == [item(key(5), blocks[key(5)])[2]]
    assert reader.used_bytes() == SIZE
    assert reader.get_many([key(5)]) == [blocks[key(5)]]
    assert gets[0] == 1


def test_a_corrupted_member_is_a_counted_miss_and_its_neighbours_still_read(
    make_tier: MakeTier, seaweed: SeaweedServer
) -> None:
    tier = make_tier()
    blocks = put_chain(tier, 4)
    raw = seaweed.client()
    name = f"{tier.settings.key_prefix}ns/{key(0)[1].hex()}"
    obj = raw.get_object(Bucket=seaweed.bucket, Key=name)
    body = bytearray(obj["Body"].read())
    body[2 * SIZE + 7] ^= 0xFF  # one bit flip in member 2
    raw.put_object(Bucket=seaweed.bucket, Key=name, Body=bytes(body), Metadata=obj["Metadata"])
    reader = make_tier()
    reader.discover(list(blocks))
    want = list(blocks.values())
    want[2] = None
    assert reader.get_many(list(blocks)) == want
    assert reader.stats()["corrupt"] == 1
    truncated = raw.get_object(Bucket=seaweed.bucket, Key=name)["Body"].read()[:-1]
    raw.put_object(Bucket=seaweed.bucket, Key=name, Body=truncated, Metadata=obj["Metadata"])
    assert tier.get_many([key(0), key(3)]) == [None, None]  # the object's length is wrong


def test_an_object_goes_when_its_last_live_block_goes(
    make_tier: MakeTier, seaweed: SeaweedServer
) -> None:
    tier = make_tier(compact_dead_share=1.0)  # never rewritten: the deletion rule alone
    put_chain(tier, 3)
    tier.delete([key(0), key(1)])
    tier.flush()
    assert len(listed(tier, seaweed)) == 3  # key(2) still lives in the object
    stats = tier.stats()
    assert stats["used_bytes"] == SIZE and stats["dead_bytes"] == 2 * SIZE
    assert not tier.contains(key(0)) and tier.get_many([key(0), key(1)]) == [None, None]
    tier.delete([key(2)])
    tier.flush()
    assert listed(tier, seaweed) == {}  # the group object and both pointers
    stats = tier.stats()
    assert stats["used_bytes"] == 0 and stats["dead_bytes"] == 0 and stats["objects"] == 0


def test_a_dead_block_put_again_comes_back_without_an_upload(make_tier: MakeTier) -> None:
    tier = make_tier()
    blocks = put_chain(tier, 3)
    tier.delete([key(1)])
    puts = count_requests(tier, "PutObject")
    tier.put_many([item(key(1), blocks[key(1)])])
    tier.flush()
    assert puts[0] == 0
    assert tier.contains(key(1)) and tier.stats()["dead_bytes"] == 0
    assert tier.used_bytes() == 3 * SIZE
    assert tier.get_many([key(1)]) == [blocks[key(1)]]


def test_other_bytes_for_a_group_s_first_block_keep_its_neighbours(make_tier: MakeTier) -> None:
    tier = make_tier()
    blocks = put_chain(tier, 3)
    tier.delete([key(0)])
    new = block(SIZE)
    tier.put_many([item(key(0), new)])  # its name holds blocks 1 and 2: written elsewhere
    tier.flush()
    assert tier.get_many([key(0), key(1), key(2)]) == [new, blocks[key(1)], blocks[key(2)]]
    assert tier.used_bytes() == 3 * SIZE
    tier.delete([key(0), key(1), key(2)])
    tier.flush()
    assert tier.stats()["objects"] == 0 and tier.used_bytes() == 0


def test_a_group_evicted_by_one_node_is_a_miss_for_another(make_tier: MakeTier) -> None:
    node_a, node_b = make_tier(), make_tier()
    blocks = put_chain(node_a, 4)
    node_b.discover(list(blocks), prefix=True)
    node_a.delete(list(blocks))
    node_a.flush()
    assert node_b.get_many(list(blocks)) == [None] * 4
    assert not any(node_b.contains(k) for k in blocks) and node_b.used_bytes() == 0
    heads = count_requests(node_b, "HeadObject")
    assert node_b.discover([key(1)]) == [None]  # the negative cache remembers the miss
    assert heads[0] == 0


def test_a_group_replaced_by_another_node_never_reads_as_wrong_bytes(
    make_tier: MakeTier,
) -> None:
    node_a, node_b = make_tier(), make_tier()
    put_chain(node_a, 4)  # object key(0) holds blocks 0-3
    other = {key(0): block(SIZE), key(9): block(SIZE)}
    node_b.put_many([item(k, v) for k, v in other.items()])  # object key(0) holds 0 and 9
    node_b.flush()
    got = node_a.get_many([key(1), key(2)])
    assert got == [None, None]
    assert not node_a.contains(key(1))


def test_restart_finds_grouped_blocks_by_scan(make_tier: MakeTier) -> None:
    first = make_tier()
    blocks = put_chain(first, 10)
    first.close()
    second = make_tier()
    found = dict(second.scan())
    assert found == {k: item(k, v)[2] for k, v in blocks.items()}
    assert second.get_many(list(blocks)) == list(blocks.values())


class PointerFaults(Faults):
    """Faults for pointer writes only (empty PutObject bodies)."""

    def __call__(self, request: Any, event_name: str = "", **kw: Any) -> AWSResponse | None:
        if request.headers.get("Content-Length") not in ("0", b"0"):
            return None
        return super().__call__(request, event_name, **kw)


def test_a_pointer_write_that_fails_transiently_is_retried(make_tier: MakeTier) -> None:
    writer = make_tier()
    faults = PointerFaults(503, "SlowDown", ops={"PutObject"}, count=2).attach(writer.client)
    blocks = put_chain(writer, 2)  # one group object, one pointer: it fails twice, then lands
    assert faults.hits == 2
    reader = make_tier()
    assert reader.discover([key(1)]) == [item(key(1), blocks[key(1)])[2]]
    assert reader.get_many([key(1)]) == [blocks[key(1)]]


def test_prefix_discovery_learns_whole_runs_from_group_objects(make_tier: MakeTier) -> None:
    writer = make_tier()
    blocks = put_chain(writer, 64)  # 8 objects of 8
    reader = make_tier(max_workers=16)  # windows of 32 keys
    heads = count_requests(reader, "HeadObject")
    chain = [*blocks, key(999)]
    metas = reader.discover(chain, prefix=True)
    assert metas == [item(k, v)[2] for k, v in blocks.items()] + [None]
    assert heads[0] <= 12  # 5 probes per window of 32 and one for the miss, not 65
    tail = make_tier()  # a chain that starts inside a group: its pointer names the group
    heads = count_requests(tail, "HeadObject")
    assert all(tail.discover(list(blocks)[3:16], prefix=True))
    assert heads[0] <= 4
    assert tail.get_many(list(blocks)[3:16]) == list(blocks.values())[3:16]
    assert not tail.contains(key(2))  # members outside the asked chain are not adopted
