"""Pins are bounded: a lease is cut to the server's ``max_lease_s`` on
every path that pins (``pin``, ``shm_lookup`` grants), a lease that is not a finite positive
number is an error frame, each tenant holds at most ``max_pinned_bytes_per_tenant`` pinned
(all or nothing, ``pin_quota``), and a client's grants go ``grant_grace_s`` after its last
connection closed, not a whole lease later."""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.client import KVStoreClient, PinQuotaError
from kvstore.testing.server import ServerProc
from tests.security.dataplane_wire import call, hello

BLOCK = 16 << 10
QUOTA_BLOCKS = 4
ADMIN, TOKEN_A, TOKEN_B = "admin-secret-0123", "tenant-a-secret-0123", "tenant-b-secret-0123"
MAX_LEASE_S = 1.0
SETTLE_S = MAX_LEASE_S + 4.0  # the cap, the reaper's second, and a slow shared machine


@pytest.fixture(scope="module")
def tenant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("pins") / "data", "--token", ADMIN,
                      "--tenant-tokens", f'{{"a": "{TOKEN_A}", "b": "{TOKEN_B}"}}',
                      "--max-lease-s", str(MAX_LEASE_S),
                      "--max-pinned-bytes-per-tenant", str(QUOTA_BLOCKS * BLOCK)).start()
    yield proc
    proc.stop()


def _blocks(n: int, salt: str) -> tuple[list[bytes], list[bytes]]:
    return ([hashlib.sha256(f"{salt}/{i}".encode()).digest() for i in range(n)],
            [os.urandom(BLOCK) for _ in range(n)])


def _pinned(c: KVStoreClient) -> int:
    return int(c.stats().totals.pinned)


def _settles(c: KVStoreClient, want: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _pinned(c) == want:
            return True
        time.sleep(0.1)
    return _pinned(c) == want


def test_a_long_lease_is_cut_to_max_lease_s(tenant_server: ServerProc, tmp_path: Path) -> None:
    ns = f"cap-{tmp_path.name}"
    hashes, data = _blocks(4, ns)
    with KVStoreClient(tenant_server.url, ADMIN, use_shm=True) as admin:
        admin.register_namespace(ns, BLOCK, {"model_id": "m"})
        admin.put(ns, hashes, data)
        info = httpx.get(f"{tenant_server.url}/v1/info",
                         headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).json()
        assert info["max_lease_s"] == MAX_LEASE_S  # what clients learn of the cap
        base = _pinned(admin)
        assert admin.pin(ns, hashes[:2], lease_s=1e7) == [True, True]
        grant = admin.lookup_acquire(ns, hashes[2:], lease_s=9e6)  # a grant, through shm
        assert grant.granted(hashes[2:]) == hashes[2:]
        assert _pinned(admin) == base + 4
        start = time.monotonic()
        assert _settles(admin, base, SETTLE_S), "pins outlived max_lease_s"
        assert time.monotonic() - start < SETTLE_S


@pytest.mark.parametrize("op", ["pin", "shm_lookup"])
@pytest.mark.parametrize("bad", [-1.0, 0, math.nan, math.inf, -math.inf, "long", True])
def test_a_lease_that_is_not_a_finite_positive_number_is_an_error_frame(
        tenant_server: ServerProc, tmp_path: Path, op: str, bad: object) -> None:
    ns = f"bad-{tmp_path.name}"
    with KVStoreClient(tenant_server.url, ADMIN, use_shm=False) as admin:
        admin.register_namespace(ns, BLOCK, {"model_id": "m"})
    s = hello(tenant_server, ADMIN)
    try:
        reply = call(s, {"op": op, "id": 2, "ns": ns, "hashes": [b"x" * 32], "lease_s": bad})
        assert not reply["ok"] and reply["error"]["code"] == "bad_request", reply
        assert "finite, positive number of seconds" in reply["error"]["message"]
        assert call(s, {"op": "ping", "id": 3})["ok"] is True  # the connection goes on
    finally:
        s.close()


def test_a_tenant_past_its_quota_is_refused_and_others_are_not(tenant_server: ServerProc,
                                                                tmp_path: Path) -> None:
    ns_a, ns_b = f"qa-{tmp_path.name}", f"qb-{tmp_path.name}"
    hashes_a, data_a = _blocks(8, ns_a)
    hashes_b, data_b = _blocks(QUOTA_BLOCKS, ns_b)
    with KVStoreClient(tenant_server.url, TOKEN_A) as a, \
            KVStoreClient(tenant_server.url, TOKEN_B) as b, \
            KVStoreClient(tenant_server.url, ADMIN) as admin:
        a.register_namespace(ns_a, BLOCK, {"model_id": "m"})
        b.register_namespace(ns_b, BLOCK, {"model_id": "m"})
        a.put(ns_a, hashes_a, data_a)
        b.put(ns_b, hashes_b, data_b)
        base = _pinned(admin)
        assert a.pin(ns_a, hashes_a[:3], lease_s=30) == [True] * 3
        # three more blocks would make six of a four-block quota: refused whole
        with pytest.raises(PinQuotaError, match="max_pinned_bytes_per_tenant") as err:
            a.pin(ns_a, hashes_a[3:6], lease_s=30)
        assert err.value.code == "pin_quota"
        assert a.release(ns_a, hashes_a[3:6]) == 0  # nothing half-pinned
        assert _pinned(admin) == base + 3
        # tenant b has its own quota, untouched by a's pins
        assert b.pin(ns_b, hashes_b, lease_s=30) == [True] * QUOTA_BLOCKS
        # the admin is not limited (it names tenant a's namespace a~name)
        assert admin.pin(f"a~{ns_a}", hashes_a, lease_s=30) == [True] * 8
        assert admin.release(f"a~{ns_a}", hashes_a) == 8
        # once a releases, it can pin again
        assert a.release(ns_a, hashes_a[:3]) == 3
        assert a.pin(ns_a, hashes_a[3:3 + QUOTA_BLOCKS], lease_s=30) == [True] * QUOTA_BLOCKS
        assert a.release(ns_a, hashes_a[3:3 + QUOTA_BLOCKS]) == QUOTA_BLOCKS
        assert b.release(ns_b, hashes_b) == QUOTA_BLOCKS
        assert _pinned(admin) == base


def test_the_quota_comes_back_when_a_tenants_client_is_gone(tenant_server: ServerProc,
                                                            tmp_path: Path) -> None:
    ns = f"qgone-{tmp_path.name}"
    hashes, data = _blocks(QUOTA_BLOCKS, ns)
    with KVStoreClient(tenant_server.url, TOKEN_A) as a:
        a.register_namespace(ns, BLOCK, {"model_id": "m"})
        a.put(ns, hashes, data)
        assert a.pin(ns, hashes, lease_s=30) == [True] * QUOTA_BLOCKS
    with KVStoreClient(tenant_server.url, TOKEN_A) as again:  # its pins went with it
        deadline = time.monotonic() + SETTLE_S
        while True:
            try:
                assert again.pin(ns, hashes, lease_s=30) == [True] * QUOTA_BLOCKS
                break
            except PinQuotaError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert again.release(ns, hashes) == QUOTA_BLOCKS


@pytest.fixture(scope="module")
def grace_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("grace") / "data", "--grant-grace-s", "0.3").start()
    yield proc
    proc.stop()


def test_grants_go_soon_after_the_granting_clients_last_connection(
        grace_server: ServerProc, tmp_path: Path) -> None:
    ns = f"grace-{tmp_path.name}"
    hashes, data = _blocks(3, ns)
    with KVStoreClient(grace_server.url, use_shm=True) as watcher:
        watcher.register_namespace(ns, BLOCK, {"model_id": "m"})
        watcher.put(ns, hashes, data)
        base = _pinned(watcher)
        sched = KVStoreClient(grace_server.url, use_shm=True)
        grant = sched.lookup_acquire(ns, hashes, lease_s=120)
        assert grant.granted(hashes) == hashes
        assert _pinned(watcher) == base + 3
        sched.close()
        # grant_grace_s (0.3 s) and the reaper's second, not the 120 s lease
        assert _settles(watcher, base, 4.0), "grants outlived their client by their lease"

