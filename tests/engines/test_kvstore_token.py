"""``kvstore-engine`` and ``kvstore-router`` against a ``kvstore serve`` that requires a token
(as it does beyond loopback, in every deployment under ``deploy/``): ``--kvstore-token-file``
gives it; without it the engine's start is one line naming the flag, not a traceback."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.store_io import RemoteStore, open_store
from kvstore.client import AuthenticationError, KVStoreClient, UnknownNamespaceError
from kvstore.testing.cli import assert_one_line
from kvstore.testing.proc import ROOT, console_script
from kvstore.testing.server import ServerProc

ENGINE = console_script("kvstore-engine", "engines.cli")
TOKEN = "engine-test-token"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, Path]]:
    """A kvstore that requires ``TOKEN``, and the file holding it."""
    base = tmp_path_factory.mktemp("guarded")
    token_file = base / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    server = ServerProc(base / "data", "--token-file", str(token_file)).start()
    yield server, token_file
    server.stop()


def generate(model: Path, url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENGINE, "generate", "--model", str(model), "--prompt-ids",
                           ",".join(str(i) for i in range(1, 41)), "--max-tokens", "2",
                           "--device", "cpu", "--kvstore", url, *flags],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_open_store_presents_the_token(guarded: tuple[ServerProc, Path]) -> None:
    server, _ = guarded
    with pytest.raises(AuthenticationError):
        open_store(server.url).lookup("nothing", [b"\0" * 32])  # type: ignore[union-attr]
    store = open_store(server.url, TOKEN)
    assert isinstance(store, RemoteStore)
    try:  # past the token check: the server looked the namespace up
        with pytest.raises(UnknownNamespaceError):
            store.lookup("nothing", [b"\0" * 32])
    finally:
        store.close()


def test_engine_stores_with_its_token_file(gqa_model: Path,
                                           guarded: tuple[ServerProc, Path]) -> None:
    server, token_file = guarded
    done = generate(gqa_model, server.url, "--kvstore-token-file", str(token_file))
    assert done.returncode == 0, done.stderr
    client = KVStoreClient(server.url, TOKEN)
    try:
        assert sum(n.blocks for n in client.stats().namespaces.values()) >= 2  # 40 tokens
    finally:
        client.close()


def test_engine_without_the_token_is_one_line(gqa_model: Path,
                                              guarded: tuple[ServerProc, Path]) -> None:
    server, _ = guarded
    assert_one_line(generate(gqa_model, server.url), "--kvstore-token-file")
