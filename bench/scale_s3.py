"""``bench_scale``'s S3 part: a store whose blocks are held only in S3, restarted on a catalog of
``n`` blocks, against a real S3 server (SeaweedFS, as the tests use).

Going through S3 for millions of blocks would take hours, so only the blocks a probe reads
(the first ``CHAIN + 1`` of the first chunk) are put through the S3 tier into the bucket (real
objects, grouped as the tier groups them); every other block is written straight into the same
catalog through its class (:class:`~kvstore.tiers.s3.holdings.Holdings`, the tier's own
records, as discovery would have left them). A probe's lookup reads the catalog and its get
reads one block from the real server.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kvstore.types import BlockHash

ENV = "KVSTORE_BENCH_S3"  # the S3 tier options a probe process is handed (JSON)
BATCH = 20_000  # catalog records written per transaction


def s3_options(root: str, server_options: dict[str, Any]) -> dict[str, Any]:
    return {**server_options, "prefix": f"scale-{os.path.basename(root)}",
            "catalog_path": os.path.join(root, "catalog"), "scan_on_start": False,
            "max_attempts": 1, "flush_timeout_s": 60.0}


def config(root: str, options: dict[str, Any]) -> Any:
    from kvstore.config import StoreConfig, TierConfig

    return StoreConfig((TierConfig("s3", 1 << 40, options=options),),
                       namespaces_path=os.path.join(root, "namespaces.json"))


def populate(root: str, n: int, options: dict[str, Any], ns_name: str, block: int,
             keys_of: Callable[[int, int], list[BlockHash]], chunk: int, uploaded: int) -> None:
    """A catalog of ``n`` S3-only blocks: the first ``uploaded`` through the S3 tier (real
    objects), the rest written into the catalog directly (see the module docstring)."""
    from kvstore.checksum import checksum
    from kvstore.namespace import Namespace
    from kvstore.store import Store
    from kvstore.tiers.base import BlockMeta
    from kvstore.tiers.s3 import S3Tier
    from kvstore.tiers.s3.client import S3Settings
    from kvstore.tiers.s3.holdings import Holdings
    from kvstore.tiers.s3.layout import Where

    ns = Namespace(ns_name, block)
    with Store(config(root, options)) as store:
        store.register_namespace(ns)
    payload = os.urandom(block)
    meta = BlockMeta(ns.layout_id, checksum(payload), block)
    first = keys_of(0, min(chunk, n))
    tier = S3Tier(1 << 40, **options)
    try:
        tier.put_many([((ns_name, k), payload, meta) for k in first[:uploaded]])
        tier.flush()
        assert tier.stats()["uploaded"] == uploaded, tier.stats()
    finally:
        tier.close()
    settings = S3Settings(**{k: v for k, v in options.items() if k != "endpoint"})
    held = Holdings(options["catalog_path"], identity=settings.catalog_identity)
    group = 8  # as the tier would have grouped them
    try:
        for seed in range(-(-n // chunk)):
            keys = first if seed == 0 else keys_of(seed, min(chunk, n - seed * chunk))
            start = uploaded if seed == 0 else 0
            for at in range(start, len(keys), BATCH):
                with held.lock:  # one LMDB transaction per batch
                    for i in range(at, min(at + BATCH, len(keys))):
                        name = (ns_name, keys[i - (i - start) % group])
                        held.hold((ns_name, keys[i]), meta, Where(name, (i - start) % group))
    finally:
        held.close()


@contextmanager
def server(workdir: str) -> Iterator[dict[str, Any]]:
    """A SeaweedFS server for the run: the S3 tier options that reach it."""
    from kvstore.testing.seaweed import SeaweedServer

    weed = SeaweedServer(os.path.join(workdir, "weed"), access_key="bench" + secrets.token_hex(4),
                         secret_key=secrets.token_hex(16), bucket="kvstore-bench").start()
    try:
        yield weed.options()
    finally:
        weed.stop()
