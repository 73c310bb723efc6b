"""Who may map the host slab: the slab is an anonymous memfd (no name in
/dev/shm), handed over the Unix socket only after an authenticated ``hello``, and only to a
principal trusted with every block in it (the admin token when tenant tokens are set). Tenant
clients fall back to the socket and cannot reach another tenant's blocks through any path."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.client import KVStoreClient
from kvstore.client.errors import (
    AuthenticationError,
    KVStoreClientError,
    PermissionDeniedError,
    UnknownNamespaceError,
)
from kvstore.client.shm_fd import receive_slab
from kvstore.client.socket_conn import FrameSocket
from kvstore.protocol import ShmAcquire, ShmLookup, ShmReserve
from kvstore.protocol.frame import PREFIX, PREFIX_BYTES, decode_header, encode_frame
from kvstore.testing.server import ServerProc

BLOCK = 16 << 10
ADMIN, TOKEN_A, TOKEN_B = "admin-secret-0123", "tenant-a-secret-0123", "tenant-b-secret-0123"


@pytest.fixture(scope="module")
def shm_tenant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path_factory.mktemp("shm-iso") / "data", "--token", ADMIN,
                      "--tenant-tokens", f'{{"a": "{TOKEN_A}", "b": "{TOKEN_B}"}}').start()
    yield proc
    proc.stop()


def _socket_path(srv: ServerProc) -> str:
    return str(srv.data_dir.resolve() / "kvstore.sock")


def _blocks(n: int, salt: str) -> tuple[list[bytes], list[bytes]]:
    return ([hashlib.sha256(f"{salt}/{i}".encode()).digest() for i in range(n)],
            [os.urandom(BLOCK) for _ in range(n)])


def test_the_slab_has_no_name_in_dev_shm(shm_tenant_server: ServerProc) -> None:
    assert shm_tenant_server.proc is not None
    maps = Path(f"/proc/{shm_tenant_server.proc.pid}/maps").read_text()
    assert "/dev/shm/" not in maps
    assert "memfd:kvstore-host" in maps
    # nor under the name older servers derived from the data dir
    from server.settings import load_settings
    name = load_settings(data_dir=str(shm_tenant_server.data_dir)).shm
    assert not os.path.exists(f"/dev/shm/{name}")


def test_an_unauthenticated_process_cannot_get_the_slab(shm_tenant_server: ServerProc) -> None:
    path = _socket_path(shm_tenant_server)
    with pytest.raises(AuthenticationError):
        receive_slab(path, None, 5.0)
    with pytest.raises(AuthenticationError):
        receive_slab(path, "wrong-token-0123456", 5.0)
    # a shm_map sent without any hello: refused, and no descriptor comes with the answer
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        sock.connect(path)
        sock.sendall(b"".join(bytes(p) for p in encode_frame({"op": "shm_map", "id": 1})))
        head, fds, _, _ = socket.recv_fds(sock, PREFIX_BYTES, 1)
        assert fds == []
        head += sock.recv(PREFIX_BYTES - len(head), socket.MSG_WAITALL)
        header_len, _ = PREFIX.unpack(head)
        reply = decode_header(sock.recv(header_len, socket.MSG_WAITALL))
        assert not reply["ok"] and reply["error"]["code"] == "unauthenticated"


def test_a_tenant_gets_no_slab_and_no_shm_op(shm_tenant_server: ServerProc) -> None:
    path = _socket_path(shm_tenant_server)
    with pytest.raises(PermissionDeniedError):
        receive_slab(path, TOKEN_B, 5.0)
    with pytest.raises(KVStoreClientError):
        KVStoreClient(shm_tenant_server.url, TOKEN_B, use_shm=True).lookup("x", [])
    conn = FrameSocket.connect(path, 5.0)
    try:
        conn.request({"op": "hello", "token": TOKEN_B})
        for req in (ShmReserve("nsb", [b"h"]), ShmAcquire("nsb", [b"h"]),
                    ShmLookup("nsb", [b"h"])):
            with pytest.raises(PermissionDeniedError):
                conn.request(req.to_header())
    finally:
        conn.close()


def test_tenant_b_cannot_read_or_write_tenant_as_blocks(shm_tenant_server: ServerProc,
                                                       tmp_path: Path) -> None:
    ns_a = f"iso-a-{tmp_path.name}"
    hashes, data = _blocks(4, ns_a)
    with KVStoreClient(shm_tenant_server.url, TOKEN_A) as a, \
            KVStoreClient(shm_tenant_server.url, TOKEN_B) as b:
        a.register_namespace(ns_a, BLOCK, {"model_id": "m"})
        assert a.put(ns_a, hashes, data).stored == 4
        assert not a.shm_active and a.get(ns_a, hashes) == data  # over the socket
        for attempt in (lambda: b.get(ns_a, hashes),
                        lambda: b.put(ns_a, hashes, [b"\xee" * BLOCK] * 4),
                        lambda: b.lookup_acquire(ns_a, hashes)):
            with pytest.raises(UnknownNamespaceError):  # a's name is unknown to b
                attempt()
        assert not b.shm_active
        assert a.get(ns_a, hashes) == data


def test_the_admin_token_keeps_the_zero_copy_path(shm_tenant_server: ServerProc,
                                                  tmp_path: Path) -> None:
    ns = f"iso-admin-{tmp_path.name}"
    hashes, data = _blocks(4, ns)
    with KVStoreClient(shm_tenant_server.url, ADMIN, use_shm=True) as admin:
        admin.register_namespace(ns, BLOCK, {"model_id": "m"})
        assert admin.put(ns, hashes, data).stored == 4
        assert admin.shm_active and admin.get(ns, hashes) == data
