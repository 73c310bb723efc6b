"""Fixtures every test folder may use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstore.testing.cli import port_in_use


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port some other process listens on."""
    with port_in_use() as port:
        yield port
