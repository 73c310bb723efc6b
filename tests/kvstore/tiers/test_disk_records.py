"""The disk tier's value decoding: the batched read path (``payloads``) against the per-value
header check, and the cached key prefixes."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import lmdb
import pytest

from kvstore.tiers.base import BlockMeta
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.disk.records import (
    BATCH_CHECK,
    HEADER,
    KeyPrefixes,
    encode_key,
    pack_value,
    payloads,
    unpack_header,
)
from tests.kvstore.tiers.contract import KiB, block, item, key

N = BATCH_CHECK + 2  # a batch checked at once (smaller ones are checked value by value)


def value(data: bytes, layout: int = 3) -> memoryview:
    return memoryview(bytes(pack_value(data, BlockMeta(layout, len(data), len(data)))))


def reference(values: Sequence[memoryview | None]) -> tuple[list[bytes | None], list[int]]:
    """One header at a time, the way every value used to be checked."""
    out: list[bytes | None] = []
    bad: list[int] = []
    for i, v in enumerate(values):
        ok = v is not None and unpack_header(v) is not None
        out.append(bytes(v[HEADER.size :]) if ok and v is not None else None)
        if v is not None and not ok:
            bad.append(i)
    return out, bad


def damaged(v: memoryview, offset: int, fmt: str, field: int) -> memoryview:
    raw = bytearray(v)
    struct.pack_into(fmt, raw, offset, field)
    return memoryview(bytes(raw))


@pytest.mark.parametrize("n", [1, BATCH_CHECK - 1, N])
def test_a_batch_of_one_size_reads_every_payload(n: int) -> None:
    datas = [block(4 * KiB) for _ in range(n)]
    out, bad = payloads([value(d) for d in datas])
    assert out == datas and bad == []
    assert all(type(b) is bytes for b in out)
    assert payloads([]) == ([], [])


@pytest.mark.parametrize(
    "why, offset, fmt, field",
    [("magic", 0, "<I", 0x58585858), ("version", 4, "<H", 9), ("size", 24, "<I", 4 * KiB - 1)],
)
def test_one_bad_header_in_a_batch_of_one_size_is_caught(
    why: str, offset: int, fmt: str, field: int
) -> None:
    """The same length as its neighbours, so only the header check can tell it apart."""
    datas = [block(4 * KiB) for _ in range(N)]
    values: list[memoryview | None] = [value(d) for d in datas]
    values[2] = damaged(value(datas[2]), offset, fmt, field)
    out, bad = payloads(values)
    assert (out, bad) == reference(values)
    assert out[2] is None and bad == [2] and out[:2] == datas[:2] and out[3:] == datas[3:], why


def test_pad_bytes_are_not_checked() -> None:
    """The batch check reads the pad with the magic; a nonzero pad sends the batch to the full
    check, which (as before) ignores it: the value still reads."""
    datas = [block(KiB) for _ in range(N)]
    values = [value(d) for d in datas]
    values[1] = damaged(values[1], 6, "<H", 1)
    assert payloads(values) == reference(values) == (datas, [])


def test_mixed_sizes_misses_and_short_values_match_the_per_value_check() -> None:
    values: list[memoryview | None] = [
        value(block(100)), None, value(block(7)), memoryview(b"short"),
        memoryview(bytes(HEADER.size - 1)), value(b""),
    ] + [value(block(100)) for _ in range(N)]
    out, bad = payloads(values)
    assert (out, bad) == reference(values)
    assert bad == [3, 4] and out[1] is None and out[5] == b""


def test_a_foreign_value_of_the_same_length_reads_as_absent_from_the_tier(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "db")
    items = [item(key(i), block(8 * KiB)) for i in range(N)]
    tier = DiskTier(1 << 20, path=path)
    tier.put_many(items)
    tier.close()
    env = lmdb.open(path, subdir=True)
    with env.begin(write=True) as txn:  # someone else's value, as long as ours
        txn.put(encode_key(key(1)), bytes(damaged(value(block(8 * KiB)), 0, "<I", 0)))
    env.close()
    tier = DiskTier(1 << 20, path=path)
    try:
        got = tier.get_many([k for k, _, _ in items])
        assert got == [data for _, data, _ in items[:1]] + [None] + [
            data for _, data, _ in items[2:]]
        assert sum("bad header" in r.getMessage() for r in caplog.records) == 1
    finally:
        tier.close()


def test_key_prefixes_encode_like_encode_key_and_stay_bounded() -> None:
    prefixes = KeyPrefixes()
    for k in (key(1), key(2, ns="llama/bf16"), ("ünï", b"\x00\x01")):
        assert prefixes[k[0]] + k[1] == encode_key(k)
    for i in range(KeyPrefixes.MAX + 10):
        assert prefixes[f"ns{i}"] == f"ns{i}".encode() + b"\x00"
    assert len(prefixes) <= KeyPrefixes.MAX
