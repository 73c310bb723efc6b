"""A real SeaweedFS S3 server for the whole test session, on loopback with a fresh data folder.

Credentials are random per session and handed to ``weed mini`` through
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (how it creates its admin identity), so the
server checks every signature as real S3 does. Each test gets its own key prefix, so tests
never see each other's objects.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.testing.seaweed import SeaweedServer
from kvstore.tiers.s3 import S3Tier

# Test tiers react within a fraction of a second: one botocore attempt, short backoffs, a
# fast probe. Production defaults are in kvstore/tiers/s3/client.py.
FAST = {
    "max_attempts": 1,
    "connect_timeout_s": 1.0,
    "read_timeout_s": 5.0,
    "demote_retries": 2,
    "retry_backoff_s": 0.05,
    "retry_backoff_max_s": 0.2,
    "probe_interval_s": 0.1,
    "flush_timeout_s": 20.0,
    "max_workers": 4,
}


def new_server(root: Path) -> SeaweedServer:
    return SeaweedServer(
        root / f"weed-{uuid.uuid4().hex[:8]}",
        access_key=f"kvtest{secrets.token_hex(4)}",
        secret_key=secrets.token_hex(16),
        bucket="kvstore-test",
    )


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    server = new_server(tmp_path_factory.mktemp("seaweed")).start()
    yield server
    server.stop()


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_tier(seaweed: SeaweedServer, prefix: str) -> Iterator[Callable[..., S3Tier]]:
    """Build S3 tiers on the session server (same prefix unless given); all closed after."""
    made: list[S3Tier] = []

    def make(capacity: int = 1 << 30, **options: Any) -> S3Tier:
        tier = S3Tier(capacity, **seaweed.options(**{"prefix": prefix, **FAST, **options}))
        made.append(tier)
        return tier

    yield make
    for tier in made:
        tier.close()
