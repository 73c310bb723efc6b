"""S3 faults: injected throttling and 5xx, a slow server, a full write-back queue, and a real
SeaweedFS stopped and restarted under the tier. Demotions never block, reads fall back to a
miss, health says degraded, and the tier recovers by itself."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstore.errors import TierUnavailableError
from kvstore.testing.seaweed import SeaweedServer
from kvstore.tiers.s3 import S3Tier
from tests.kvstore.s3.conftest import FAST, new_server
from tests.kvstore.s3.faults import Faults, wait_for
from tests.kvstore.tiers.contract import KiB, block, item, key

MakeTier = Callable[..., S3Tier]


def timed(fn: Callable[[], object]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [(503, "SlowDown", "throttled"), (500, "InternalError", "unavailable")],
)
def test_failing_uploads_are_retried_then_dropped_and_counted(
    make_tier: MakeTier, status: int, code: str, reason: str
) -> None:
    tier = make_tier()
    stored = block(1000)
    tier.put_many([item(key(0), stored)])
    tier.flush()
    faults = Faults(status, code).attach(tier.client, tier.probe_client)
    blocks = [block(4 * KiB) for _ in range(5)]
    took = timed(lambda: tier.put_many([item(key(i + 1), b) for i, b in enumerate(blocks)]))
    assert took < 0.5  # the demotion returned; S3 is behind the queue
    assert tier.get_many([key(1)]) == [blocks[0]]  # served from the queue meanwhile
    wait_for(lambda: tier.health()["dropped"] == 5, what="5 drops")
    health = tier.health()
    assert health["ok"] is False and health["degraded"] and health["reason"] == reason
    assert health["pending"] == 0 and health["uploaded"] == 1
    assert health["errors"] >= 3  # one object of 5 blocks x (1 try + 2 retries), + probes
    assert code in health["last_error"]
    assert faults.hits >= 3
    assert not tier.contains(key(1)) and tier.used_bytes() == len(stored)
    # Degraded reads are misses at once, without asking S3.
    hits = faults.hits
    assert tier.get_many([key(0)]) == [None]
    assert tier.discover([key(7)]) == [None]
    assert faults.hits - hits <= 1  # at most a concurrent probe
    faults.active = False  # S3 is back: the probe notices, nobody calls the tier
    wait_for(lambda: tier.health()["ok"], what="recovery")
    assert tier.health()["recoveries"] >= 1
    assert tier.get_many([key(0)]) == [stored]


def test_transient_errors_are_retried_to_success(make_tier: MakeTier) -> None:
    tier = make_tier()
    faults = Faults(503, "SlowDown", ops={"PutObject"}, count=2).attach(tier.client)
    data = block(2000)
    tier.put_many([item(key(1), data)])
    tier.flush()
    health = tier.health()
    assert faults.hits == 2
    assert health["uploaded"] == 1 and health["dropped"] == 0 and health["errors"] == 2
    assert make_tier().discover([key(1)])[0] is not None


def test_botocore_retries_throttling_before_we_see_it(make_tier: MakeTier) -> None:
    tier = make_tier(max_attempts=3, retry_mode="standard")  # 3 attempts in all
    faults = Faults(503, "SlowDown", ops={"PutObject"}, count=2).attach(tier.client)
    tier.put_many([item(key(1), block(100))])
    tier.flush()
    assert faults.hits == 2
    assert tier.health()["errors"] == 0 and tier.health()["uploaded"] == 1
    tier3 = make_tier(max_attempts=3, retry_mode="standard")
    faults = Faults(503, "SlowDown", ops={"PutObject"}, count=3).attach(tier3.client)
    tier3.put_many([item(key(1), block(100))])
    tier3.flush()  # botocore gave up after 3 attempts; our retry then succeeded
    assert faults.hits == 3 and tier3.health()["errors"] == 1


def test_full_queue_refuses_the_demotion_instead_of_blocking(make_tier: MakeTier) -> None:
    tier = make_tier(queue_bytes=1 << 20, group_blocks=1)  # one upload per block
    slow = Faults(ops={"PutObject"}, delay_s=0.5).attach(tier.client)
    tier.put_many([item(key(i), block(256 * KiB)) for i in range(4)])  # exactly full
    with pytest.raises(TierUnavailableError, match="queue full"):
        tier.put_many([item(key(9), block(1)), item(key(10), block(1))])
    assert not tier.contains(key(9)) and not tier.contains(key(10))
    assert tier.used_bytes() == 4 * 256 * KiB
    tier.flush()
    assert slow.hits == 4 and tier.health()["uploaded"] == 4
    tier.put_many([item(key(9), block(1))])  # room again


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[SeaweedServer]:
    server = new_server(tmp_path).start()
    yield server
    server.stop()


def test_server_stopped_and_restarted(own_server: SeaweedServer) -> None:
    options = {**FAST, "demote_retries": 30, "retry_backoff_max_s": 0.5, "prefix": "outage"}
    tier = S3Tier(1 << 30, **own_server.options(**options))
    try:
        before = block(64 * KiB)
        tier.put_many([item(key(0), before)])
        tier.flush()
        own_server.stop()
        # S3 is gone. Demotions still return at once and are served from the queue.
        during = block(64 * KiB)
        assert timed(lambda: tier.put_many([item(key(1), during)])) < 0.5
        assert tier.get_many([key(1)]) == [during]
        wait_for(lambda: tier.health()["degraded"], what="degraded")
        assert tier.health()["reason"] == "unavailable"
        assert timed(lambda: tier.get_many([key(0)]) == [None]) < 0.5
        assert tier.get_many([key(0)]) == [None]
        own_server.start()
        wait_for(lambda: tier.health()["ok"], timeout_s=20, what="recovery")
        tier.flush()
        health = tier.health()
        assert health["pending"] == 0 and health["dropped"] == 0 and health["uploaded"] == 2
        assert tier.get_many([key(0), key(1)]) == [before, during]
        other = S3Tier(1 << 30, **own_server.options(**options))
        try:
            assert dict(other.scan()) == {
                k: item(k, b)[2] for k, b in ((key(0), before), (key(1), during))
            }
        finally:
            other.close()
    finally:
        tier.close()


def test_dead_endpoint_fails_fast_and_starts_degraded() -> None:
    start = time.monotonic()
    tier = S3Tier(
        1 << 20,
        bucket="b",
        endpoint_url="http://127.0.0.1:9",  # discard port: nothing listens
        access_key_id="k",
        secret_access_key="s",
        **FAST,
    )
    try:
        assert time.monotonic() - start < 3
        assert tier.health()["reason"] == "unavailable"
        assert tier.get_many([key(1)]) == [None]
        tier.put_many([item(key(1), block(10))])  # queued; dropped after retries
        wait_for(lambda: tier.health()["dropped"] == 1, what="drop")
    finally:
        tier.close()
