"""Copies around the 4K-aliasing trap: a copy whose destination lies just past its source
(modulo 4 KiB) goes through scratch where the CPU is slow at it, and lands the same bytes
with the same checksum as a plain copy."""

from __future__ import annotations

import mmap
import os

import pytest
import xxhash

from kvstore import copying
from kvstore.checksum import CHUNK, checksum, copy_summed


@pytest.fixture
def area() -> memoryview:
    """Page-aligned memory, as the slab's places are."""
    return memoryview(mmap.mmap(-1, 1 << 22))


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copying, "_slow", True)  # as on AMD Zen 3 and 4 with glibc's memcpy


def test_the_probe_answers_once_and_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copying, "_slow", None)
    first = copying.slow_when_aliased()
    assert copying.slow_when_aliased() is first


def test_only_a_destination_just_past_the_source_is_trapped(area: memoryview,
                                                            slow: None) -> None:
    src = area[:CHUNK]
    for gap, trapped in ((0, False), (16, True), (63, True), (64, False), (2048, False),
                         (4096 + 16, True), (4096 - 16, False)):
        start = (1 << 21) + gap
        assert copying.trapped(area[start:start + CHUNK], src) is trapped, gap


def test_scratch_lies_half_a_page_from_the_source(area: memoryview, slow: None) -> None:
    for skew in (0, 16, 100):
        src = area[skew:skew + 1000]
        tmp = copying.scratch_for(src, 1000)
        assert tmp.nbytes == 1000
        assert (copying.address(tmp) - copying.address(src)) % copying.PAGE == 2048


@pytest.mark.parametrize("of_src", [False, True])
@pytest.mark.parametrize("size", [1000, CHUNK, 3 * CHUNK + 777])
def test_a_trapped_copy_lands_the_same_bytes_and_checksum(area: memoryview, slow: None,
                                                          of_src: bool, size: int) -> None:
    data = os.urandom(size)
    area[:size] = data
    src, dest = area[:size], area[(1 << 21) + 16:(1 << 21) + 16 + size]
    assert copying.trapped(dest, src)
    h = xxhash.xxh3_64()
    copy_summed(dest, src, h, of_src=of_src)
    assert bytes(dest) == data and h.intdigest() == checksum(data)


def test_a_read_only_source_is_copied_too(area: memoryview, slow: None) -> None:
    data = os.urandom(5000)
    h = xxhash.xxh3_64()
    copy_summed(area[16:5016], memoryview(data), h, of_src=True)
    assert bytes(area[16:5016]) == data and h.intdigest() == checksum(data)
