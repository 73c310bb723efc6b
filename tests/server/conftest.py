"""Fixtures: real ``kvstore serve`` processes on free loopback ports with temp data dirs."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstore.testing.server import ServerProc

BLOCK = 4096


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """One plain server (no auth) shared by a test module."""
    proc = ServerProc(tmp_path_factory.mktemp("kvs") / "data",
                      "--frame-timeout-s", "2").start()
    yield proc
    proc.stop()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., ServerProc]]:
    """Factory for servers with their own flags; all are stopped at the end."""
    made: list[ServerProc] = []

    def make(*args: str, name: str = "data", **kw: object) -> ServerProc:
        proc = ServerProc(tmp_path / name, *args, **kw)  # type: ignore[arg-type]
        made.append(proc)
        return proc.start()

    yield make
    for proc in made:
        proc.stop()


@pytest.fixture
def ns_name(request: pytest.FixtureRequest) -> str:
    return "t-" + re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:60] + "-" \
        + os.urandom(3).hex()
