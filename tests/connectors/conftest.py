"""A real ``kvstore serve`` subprocess for the connector's store-link tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.testing.server import ServerProc


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    """Started; tests may stop and start it again on the same ports and data folder."""
    srv = ServerProc(tmp_path / "data").start()
    yield srv
    srv.stop()
