"""S3 tier against a real SeaweedFS: the tier contract, large blocks, object layout,
credentials, restart, corruption and deletion."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kvstore.checksum import checksum
from kvstore.errors import TierUnavailableError
from kvstore.testing.seaweed import SeaweedServer
from kvstore.tiers.base import Tier
from kvstore.tiers.s3 import S3Tier
from tests.kvstore.s3.conftest import FAST
from tests.kvstore.tiers.contract import KiB, TierContract, block, item, key

MiB = 1 << 20
MakeTier = Callable[..., S3Tier]


class TestS3Contract(TierContract):
    @pytest.fixture(autouse=True)
    def _server(self, seaweed: SeaweedServer, prefix: str) -> None:
        self.seaweed = seaweed
        self.prefix = prefix

    def make_tier(self, capacity: int) -> Tier:
        return S3Tier(capacity, **self.seaweed.options(prefix=self.prefix, **FAST))


@pytest.mark.parametrize("size", [256 * KiB, 2 * MiB])
def test_blocks_round_trip_through_s3_byte_identical(make_tier: MakeTier, size: int) -> None:
    writer = make_tier()
    blocks = {key(i): block(size) for i in range(6)}
    writer.put_many([item(k, v) for k, v in blocks.items()])
    writer.flush()
    assert writer.health()["pending"] == 0
    # A second tier has no queue to answer from: these bytes come from S3.
    reader = make_tier()
    assert reader.discover(list(blocks)) == [writer_meta for writer_meta in _metas(blocks)]
    assert reader.get_many(list(blocks)) == list(blocks.values())
    assert reader.stats()["corrupt"] == 0


def _metas(blocks: dict) -> list:  # type: ignore[type-arg]
    return [item(k, v)[2] for k, v in blocks.items()]


def test_object_key_and_metadata_layout(make_tier: MakeTier, seaweed: SeaweedServer) -> None:
    tier = make_tier()
    data = block(1000)
    k = ("llama-8b@v1", bytes.fromhex("00ff") * 16)
    tier.put_many([item(k, data, layout_id=42)])
    tier.flush()
    name = f"{tier.settings.key_prefix}llama-8b@v1/{'00ff' * 16}"
    head = seaweed.client().head_object(Bucket=seaweed.bucket, Key=name)
    assert head["ContentLength"] == 1000
    assert head["Metadata"] == {
        "kv-layout": "42",
        "kv-checksum": str(checksum(data)),
        "kv-size": "1000",
    }


def test_large_block_uploads_in_parts(make_tier: MakeTier, seaweed: SeaweedServer) -> None:
    tier = make_tier(multipart_threshold=5 * MiB)
    data = block(11 * MiB)
    tier.put_many([item(key(1), data)])
    tier.flush()
    head = seaweed.client().head_object(
        Bucket=seaweed.bucket, Key=f"{tier.settings.key_prefix}ns/{key(1)[1].hex()}"
    )
    assert head["ETag"].strip('"').endswith("-3")  # a multipart ETag: md5-of-parts-N
    assert head["Metadata"]["kv-size"] == str(len(data))
    assert make_tier().discover([key(1)])[0] is not None
    assert make_tier().get_many([key(1)]) == [None]  # unknown to a tier that did not discover
    fresh = make_tier()
    fresh.discover([key(1)])
    assert fresh.get_many([key(1)]) == [data]


def test_wrong_secret_is_reported_as_a_credentials_error(
    make_tier: MakeTier, seaweed: SeaweedServer
) -> None:
    good = make_tier()
    good.put_many([item(key(1), block(100))])
    good.flush()
    bad = make_tier(secret_access_key="not-the-secret")
    health = bad.health()
    assert health["ok"] is False and health["reason"] == "auth"
    assert "SignatureDoesNotMatch" in health["last_error"]
    assert "AWS_SECRET_ACCESS_KEY" in health["last_error"]
    with pytest.raises(TierUnavailableError, match="credentials"):
        bad.put_many([item(key(2), block(100))])
    assert not bad.contains(key(2))
    assert bad.discover([key(1)]) == [None]
    unknown_key = make_tier(access_key_id="nobody", secret_access_key="x")
    assert unknown_key.health()["reason"] == "auth"
    assert "InvalidAccessKeyId" in unknown_key.health()["last_error"]


def test_credentials_from_the_standard_environment(
    seaweed: SeaweedServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    tier = S3Tier(1 << 20, bucket=seaweed.bucket, endpoint_url=seaweed.endpoint_url, prefix=prefix)
    try:
        assert tier.health()["ok"] is True
        data = block(500)
        tier.put_many([item(key(1), data)])
        tier.flush()
        assert tier.health()["uploaded"] == 1
    finally:
        tier.close()


def test_restarted_tier_finds_its_blocks_by_scan(make_tier: MakeTier) -> None:
    first = make_tier()
    blocks = {key(i, ns=f"ns{i % 2}"): block(3 * KiB + i) for i in range(25)}
    first.put_many([item(k, v, layout_id=i) for i, (k, v) in enumerate(blocks.items())])
    first.close()  # close drains the write-back queue
    second = make_tier()
    assert second.used_bytes() == 0 and not second.contains(key(0, ns="ns0"))
    found = dict(second.scan())
    assert found == {k: item(k, v, layout_id=i)[2] for i, (k, v) in enumerate(blocks.items())}
    assert second.used_bytes() == sum(len(v) for v in blocks.values())
    assert second.get_many(list(blocks)) == list(blocks.values())


def test_scan_can_be_turned_off(make_tier: MakeTier) -> None:
    first = make_tier()
    first.put_many([item(key(1), block(10))])
    first.flush()
    assert list(make_tier(scan_on_start=False).scan()) == []


def test_corrupted_object_is_a_counted_miss(make_tier: MakeTier, seaweed: SeaweedServer) -> None:
    tier = make_tier(group_blocks=1)  # one object per block (groups: test_s3_groups.py)
    good, other = block(64 * KiB), block(64 * KiB)
    tier.put_many([item(key(1), good), item(key(2), good)])
    tier.flush()
    raw = seaweed.client()
    for k, body in ((key(1), other), (key(2), good[:-1])):  # flipped bytes; truncated body
        name = f"{tier.settings.key_prefix}ns/{k[1].hex()}"
        meta = raw.head_object(Bucket=seaweed.bucket, Key=name)["Metadata"]
        raw.put_object(Bucket=seaweed.bucket, Key=name, Body=body, Metadata=meta)
    reader = make_tier(group_blocks=1)
    reader.discover([key(1)])  # key(2)'s size no longer matches: discover refuses it
    assert reader.discover([key(2)]) == [None]
    got = reader.get_many([key(1)])
    assert got == [None]
    assert checksum(other) != checksum(good)
    assert reader.stats()["corrupt"] == 1
    assert tier.get_many([key(1), key(2)]) == [None, None]
    assert tier.stats()["corrupt"] == 2


def test_delete_removes_the_object_in_the_background(
    make_tier: MakeTier, seaweed: SeaweedServer
) -> None:
    tier = make_tier(group_blocks=1)  # one object per block (groups: test_s3_groups.py)
    tier.put_many([item(key(i), block(100)) for i in range(3)])
    tier.flush()
    start = time.monotonic()
    tier.delete([key(0), key(1)])
    assert time.monotonic() - start < 0.1  # eviction does not wait for S3

    def listed() -> set[str]:
        resp = seaweed.client().list_objects_v2(
            Bucket=seaweed.bucket, Prefix=tier.settings.key_prefix
        )
        return {o["Key"].rsplit("/", 1)[1] for o in resp.get("Contents", [])}

    tier.flush()
    assert listed() == {key(2)[1].hex()}


def test_unknown_option_is_refused_with_the_known_ones(seaweed: SeaweedServer) -> None:
    with pytest.raises(ValueError, match=r"known: .*bucket"):
        S3Tier(1 << 20, **seaweed.options(buckett="x"))
    with pytest.raises(ValueError, match="bucket"):
        S3Tier(1 << 20, bucket="")
    with pytest.raises(ValueError, match="disagree"):
        S3Tier(1 << 20, bucket="b", endpoint="http://a:1", endpoint_url="http://b:1")


def test_endpoint_alias_of_the_server_settings(seaweed: SeaweedServer, prefix: str) -> None:
    options = seaweed.options(prefix=prefix)
    options["endpoint"] = options.pop("endpoint_url")
    tier = S3Tier(1 << 20, **options)
    try:
        assert tier.settings.endpoint_url == seaweed.endpoint_url
        assert tier.health()["ok"] is True
    finally:
        tier.close()
