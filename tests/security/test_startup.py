"""What a starting server may take over: only a stale Unix socket,
never a file, a folder or a live socket at ``--unix-socket``; never the shared-memory segment
of a live server with the same ``--shm-name``. A refusal is one line and exit code 2."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstore.client import KVStoreClient
from kvstore.testing.proc import free_port
from kvstore.testing.server import ServerProc, kvstore_cmd


@pytest.fixture
def store_short_dir() -> Iterator[Path]:
    """A folder with a short path (a Unix socket path must stay under ~100 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="kvs-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def serve_once(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kvstore serve`` expected to refuse at once (it would otherwise run until killed)."""
    cmd = [*kvstore_cmd(), "serve", "--data-dir", str(data), "--port", str(free_port()),
           "--data-port", str(free_port()), "--host-capacity", "8MiB", "--disk-capacity",
           "32MiB", "--log-level", "warning", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def assert_refused(run: subprocess.CompletedProcess[str], words: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("kind", ["file", "folder", "live socket"])
def test_unix_socket_path_that_is_not_stale_is_never_removed(
        store_short_dir: Path, kind: str) -> None:
    path = store_short_dir / "s.sock"
    listener: socket.socket | None = None
    if kind == "file":
        path.write_text("precious")
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_text("precious")
    else:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(1)
    try:
        run = serve_once(store_short_dir / "data", "--unix-socket", str(path))
        assert_refused(run, str(path))
        if kind == "file":
            assert path.read_text() == "precious"
        elif kind == "folder":
            assert (path / "inside").read_text() == "precious"
        else:
            assert path.is_socket()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.connect(str(path))  # still ours
    finally:
        if listener is not None:
            listener.close()


def test_stale_unix_socket_is_replaced(store_short_dir: Path) -> None:
    path = store_short_dir / "s.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens: what a killed server leaves
    proc = ServerProc(store_short_dir / "data", "--unix-socket", str(path)).start()
    try:
        assert path.is_socket()
        with KVStoreClient(proc.url, transport="unix") as client:
            assert client.health().ok
    finally:
        proc.stop()


def test_two_servers_given_the_same_shm_name_keep_their_own_slabs(store_short_dir: Path) -> None:
    """A second server configured with the first one's ``--shm-name`` used to unlink the
    first's live segment, whose clients then read the second server's bytes. The slab is now
    an anonymous memfd (the name is ignored): nothing of either server is in /dev/shm, both
    run, and each one's shared-memory clients read their own blocks."""
    name = "kvs-sec-" + os.urandom(4).hex()
    first = ServerProc(store_short_dir / "one", "--shm-name", name).start()
    try:
        ns, h = "shm-owner", os.urandom(16)
        mine, theirs = os.urandom(4096), os.urandom(4096)
        with KVStoreClient(first.url, use_shm=True) as client:
            client.register_namespace(ns, 4096, {})
            client.put(ns, [h], [mine])
            second = ServerProc(store_short_dir / "two", "--shm-name", name).start()
            try:
                with KVStoreClient(second.url, use_shm=True) as other:
                    other.register_namespace(ns, 4096, {})
                    other.put(ns, [h], [theirs])
                    assert other.shm_active and other.get(ns, [h]) == [theirs]
                assert not (Path("/dev/shm") / name).exists()
                assert client.shm_active and client.get(ns, [h]) == [mine]
            finally:
                second.stop()
        assert httpx.get(first.url + "/healthz", timeout=30).status_code == 200
    finally:
        first.stop()
