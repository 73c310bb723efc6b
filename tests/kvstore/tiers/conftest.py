"""Fixtures for the tier tests: no test may leave a shared memory segment of this process
behind (segments are named ``kvstore-<pid>-...``; other processes on the machine have their
own)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def _kvstore_segments() -> set[str]:
    try:
        prefix = f"kvstore-{os.getpid()}-"
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except FileNotFoundError:  # no POSIX shm mount: nothing to leak
        return set()


@pytest.fixture(autouse=True)
def no_leaked_shm() -> Iterator[None]:
    before = _kvstore_segments()
    yield
    leaked = _kvstore_segments() - before
    assert not leaked, f"shared memory segments left behind: {sorted(leaked)}"
