"""Raw shared-memory ops for the security tests: reserve, acquire, commit and put frames sent
as a client would, so that a test can stall between them as a late writer or reader does, and
a stray writer that flips bytes where a block lies in the host slab."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

from kvstore.client import KVStoreClient
from kvstore.client.exchange import Call, Link, Steps
from kvstore.protocol import (
    ExtentsReply,
    Put,
    PutReply,
    ShmAcquire,
    ShmCommit,
    ShmRelease,
    ShmReserve,
)

BLOCK = 64 << 10
REAP_S = 2.5  # the server expires leases every second


def blocks(n: int, salt: str, size: int = BLOCK) -> tuple[list[bytes], list[bytes]]:
    """``n`` hashes named by ``salt`` and as many random blocks."""
    return ([hashlib.sha256(f"{salt}/{i}".encode()).digest() for i in range(n)],
            [os.urandom(size) for _ in range(n)])


def reserve(link: Link, ns: str, hashes: list[bytes], lease_s: float) -> Steps[ExtentsReply]:
    header, _ = yield Call(ShmReserve(ns, hashes, lease_s))
    return ExtentsReply.from_header(header)


def acquire(link: Link, ns: str, hashes: list[bytes], lease_s: float = 30.0,
            release: bool = False) -> Steps[ExtentsReply]:
    """Pin ``hashes`` for a read; with ``release``, drop the pins at once (only the extents
    are wanted)."""
    header, _ = yield Call(ShmAcquire(ns, hashes, lease_s))
    got = ExtentsReply.from_header(header)
    if release:
        yield Call(ShmRelease(ns, hashes))
    return got


def commit(link: Link, ns: str, hashes: list[bytes], gens: list[int | None],
           sums: list[int | None] | None = None) -> Steps[PutReply]:
    header, _ = yield Call(ShmCommit(ns, hashes, gens, sums))
    return PutReply.from_header(header)


def put_raw(link: Link, ns: str, hashes: list[bytes], data: list[bytes],
            sums: list[int | None]) -> Steps[PutReply]:
    """A socket put that names its own checksums."""
    header, _ = yield Call(Put(ns, hashes, [len(b) for b in data], False, sums), data)
    return PutReply.from_header(header)


def slots(extents: list[Any]) -> set[int]:
    """The first offsets of every extent of every block."""
    return {int(off) for ext in extents if ext is not None for off, _ in ext}


def flip(client: KVStoreClient, ns: str, hashes: list[bytes]) -> None:
    """Flip one byte of each block where it lies in the host slab (as a stray writer with
    the mapping would); ``client`` maps the slab."""
    extents = client._run(acquire, ns, hashes, 30.0, True).extents  # connects: maps the slab
    slab = client._core.slab
    assert slab is not None
    for ext in extents:
        assert ext is not None
        off = int(ext[0][0]) + 100
        slab.buf[off] ^= 0xFF


def vllm_side(url: str, namespace: str) -> tuple[Any, Callable[[], Any], Any]:
    """A vLLM connector's worker side over a real server, its CPU caches registered (2 layers
    of 8 blocks): ``(side, make_link, layout)``; ``make_link()`` opens another store link of
    the same namespace (the scheduler side's). Needs vllm (the caller skips without it)."""
    import torch

    from connectors.vllm.config import ConnectorConfig
    from connectors.vllm.layout import KVLayout
    from connectors.vllm.store_link import StoreLink
    from connectors.vllm.worker_side import WorkerSide

    layout = KVLayout("m", 2, 2, 32, 32, "float32", "cpu-test")
    cfg = ConnectorConfig(url, timeout_s=2.0)

    def make_link() -> StoreLink:
        return StoreLink(cfg, namespace, layout.block_bytes, layout.to_store_layout(),
                         "sha256", None)

    side = WorkerSide(layout, make_link, 5.0)
    side.register_kv_caches({f"layer.{i}": torch.zeros(8, 2, 32, 64) for i in range(2)}, 8)
    return side, make_link, layout


def granted_load(req_id: str, hashes: list[bytes], grant: Any, namespace: str,
                 **extra: Any) -> Any:
    """The connector metadata that loads ``hashes`` into cache blocks 1.. from ``grant``
    (``extra``: more fields of the transfer, such as ``sums``)."""
    from connectors.vllm.metadata import BlockTransfer, KVStoreConnectorMetadata

    return KVStoreConnectorMetadata(loads=[BlockTransfer(
        req_id, list(range(1, len(hashes) + 1)), hashes, notify=False, extents=grant.extents,
        instance=grant.instance, granted_at=time.monotonic(), granted_ns=namespace,
        gens=grant.gens, **extra)])
