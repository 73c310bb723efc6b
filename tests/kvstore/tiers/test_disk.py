"""Disk tier: the contract, plus restart, crash durability, corruption and foreign values."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import lmdb
import pytest

from kvstore.checksum import checksum
from kvstore.errors import TierUnavailableError
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.disk.records import HEADER, decode_key, encode_key, pack_value, unpack_header
from tests.kvstore.tiers.contract import KiB, TierContract, block, item, key

REPO = Path(__file__).resolve().parents[3]
_dirs = itertools.count()


class TestDiskContract(TierContract):
    @pytest.fixture(autouse=True)
    def _in_tmp(self, tmp_path: Path) -> None:
        self.tmp = tmp_path

    def make_tier(self, capacity: int) -> DiskTier:
        return DiskTier(capacity, path=str(self.tmp / f"db{next(_dirs)}"))


def test_key_and_header_encoding() -> None:
    k = ("llama-3/bf16", b"\x00\x01\x00" * 11)
    assert decode_key(encode_key(k)) == k
    meta = BlockMeta(2**64 - 1, 2**63 + 5, 3)
    value = pack_value(b"abc", meta)
    assert len(value) == HEADER.size + 3 and value[HEADER.size :] == b"abc"
    assert unpack_header(value) == meta
    assert unpack_header(b"XXXX" + bytes(value[4:])) is None  # bad magic
    assert unpack_header(value[:-1]) is None  # truncated payload
    assert unpack_header(value[:10]) is None  # shorter than a header


def test_restart_finds_every_block(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    blocks = {
        key(i, ns=f"ns{i % 3}"): block(n) for i, n in enumerate((1, 5000, 64 * KiB, 300 * KiB))
    }
    metas = {k: BlockMeta(i, checksum(v), len(v)) for i, (k, v) in enumerate(blocks.items())}
    tier = DiskTier(8 << 20, path=path)
    tier.put_many([(k, v, metas[k]) for k, v in blocks.items()])
    tier.put_many([item(key(99), block(10))])
    tier.delete([key(99)])
    used = tier.used_bytes()
    tier.close()

    again = DiskTier(8 << 20, path=path)
    try:
        assert dict(again.scan()) == metas
        assert again.used_bytes() == used == sum(len(v) for v in blocks.values())
        assert again.get_many(list(blocks)) == list(blocks.values())
        assert again.contains(key(0, ns="ns0")) and not again.contains(key(99))
    finally:
        again.close()


def test_committed_put_survives_kill_9(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    code = textwrap.dedent(
        f"""
        import os, signal
        from kvstore.tiers.base import BlockMeta
        from kvstore.tiers.disk import DiskTier
        t = DiskTier(1 << 20, path={path!r})
        items = [(("ns", b"k%d" % i), bytes([i]) * 4096, BlockMeta(1, i, 4096)) for i in range(5)]
        t.put_many(items)
        os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush, no atexit
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    tier = DiskTier(1 << 20, path=path)
    try:
        found = dict(tier.scan())
        assert found == {("ns", b"k%d" % i): BlockMeta(1, i, 4096) for i in range(5)}
        assert tier.get_many([("ns", b"k3")]) == [b"\x03" * 4096]
    finally:
        tier.close()


def test_flipped_byte_in_the_file_changes_what_is_read(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    data = block(64 * KiB)
    tier = DiskTier(1 << 20, path=path)
    tier.put_many([item(key(1), data)])
    tier.close()

    db = Path(path) / "data.mdb"
    raw = bytearray(db.read_bytes())
    at = raw.find(data[1000:1064])
    assert at >= 0, "payload not found in data.mdb"
    raw[at] ^= 0xFF
    db.write_bytes(raw)

    tier = DiskTier(1 << 20, path=path)
    try:
        ((stored_key, meta),) = tier.scan()  # the header is intact: the block is still listed
        assert stored_key == key(1)
        (got,) = tier.get_many([key(1)])
        assert got is not None and len(got) == len(data)
        assert got != data
        assert checksum(got) != meta.checksum  # what the store checks (verify_reads)
        assert tier.verify_reads
    finally:
        tier.close()


def test_scan_follows_puts_and_deletes(tmp_path: Path) -> None:
    tier = DiskTier(1 << 20, path=str(tmp_path / "db"))
    try:
        tier.put_many([(key(1), b"abc", BlockMeta(5, 6, 3)), (key(2), b"de", BlockMeta(5, 7, 2))])
        tier.delete([key(1)])
        tier.put_many([(key(2), b"fgh", BlockMeta(5, 8, 3))])
        assert dict(tier.scan()) == {key(2): BlockMeta(5, 8, 3)}
    finally:
        tier.close()


def test_values_with_a_bad_header_are_absent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "db")
    good = block(1000)
    tier = DiskTier(1 << 20, path=path)
    tier.put_many([item(key(1), good)])
    tier.close()
    # Someone else's values in our file: a wrong magic and a value too short for a header.
    env = lmdb.open(path, subdir=True)
    with env.begin(write=True) as txn:
        txn.put(
            encode_key(key(2)), b"XXXX" + bytes(pack_value(b"y" * 100, BlockMeta(0, 0, 100)))[4:]
        )
        txn.put(encode_key(key(3)), b"short")
    env.close()

    tier = DiskTier(1 << 20, path=path)
    try:
        assert [k for k, _ in tier.scan()] == [key(1)]  # the open reads no header; a scan does
        assert sum("bad header" in r.getMessage() for r in caplog.records) == 2  # both logged
        assert tier.get_many([key(1), key(2), key(3)]) == [good, None, None]
        assert not tier.contains(key(2))
        assert tier.used_bytes() == len(good)
        tier.put_many([item(key(2), b"mine")])  # a put takes the key over
        assert tier.get_many([key(2)]) == [b"mine"]
    finally:
        tier.close()


def test_map_grows_when_full_under_concurrent_reads(tmp_path: Path) -> None:
    tier = DiskTier(16 << 20, path=str(tmp_path / "db"), map_size=256 * KiB)
    first = block(1000)
    tier.put_many([item(key(1000), first)])
    stop, bad = threading.Event(), list[object]()

    def reader() -> None:  # a remap under an open read txn would invalidate it
        while not stop.is_set():
            try:
                if tier.get_many([key(1000)]) != [first]:
                    bad.append("wrong bytes")
            except Exception as exc:
                bad.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        start = tier.map_size()
        blocks = [block(256 * KiB) for _ in range(24)]
        for i in range(0, 24, 8):
            tier.put_many([item(key(i + j), blocks[i + j]) for j in range(8)])
        assert tier.map_size() > start
        assert tier.get_many([key(i) for i in range(24)]) == blocks
    finally:
        stop.set()
        thread.join()
        tier.close()
    assert not bad, bad[:3]


def test_unusable_path_is_unavailable(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_bytes(b"x")
    with pytest.raises(TierUnavailableError):
        DiskTier(1 << 20, path=str(not_a_dir))


def test_flush_and_closed_tier(tmp_path: Path) -> None:
    tier = DiskTier(1 << 20, path=str(tmp_path / "db"))
    tier.put_many([item(key(1), b"abc")])
    tier.flush()
    assert tier.health()["blocks"] == 1
    tier.close()
    tier.flush()  # a no-op once closed
    assert tier.health()["ok"] is False
    with pytest.raises(RuntimeError):
        tier.put_many([item(key(2), b"x")])


def test_restart_reads_counts_not_headers(tmp_path: Path) -> None:
    """The counts a restart needs are records in the file, kept by every put and delete; an
    overwrite counts once."""
    path = str(tmp_path / "db")
    tier = DiskTier(8 << 20, path=path)
    tier.put_many([item(key(i, ns=f"n{i % 2}"), block(100 + i)) for i in range(10)])
    tier.put_many([item(key(0, ns="n0"), block(7))])  # overwrite: 100 -> 7 bytes
    tier.delete([key(1, ns="n1"), key(77)])
    want = tier.namespace_usage()
    assert want == {"n0": (5, 7 + 102 + 104 + 106 + 108), "n1": (4, 103 + 105 + 107 + 109)}
    tier.close()
    again = DiskTier(8 << 20, path=path)
    try:
        assert again.namespace_usage() == want and len(again) == 9
        assert again.used_bytes() == sum(b for _, b in want.values())
        assert sorted(again.keys_of("n1")) == sorted(key(i, ns="n1") for i in (3, 5, 7, 9))
        assert again.leading("n0", [key(i)[1] for i in (0, 2, 4, 5, 6)]) == 3
        assert again.metas([key(2, ns="n0"), key(3, ns="n0")])[1] is None
    finally:
        again.close()


def test_a_file_without_counts_is_counted_once(tmp_path: Path) -> None:
    """A file written before the counts existed (blocks only, as raw LMDB) is scanned at its
    first open, then never again."""
    path = str(tmp_path / "db")
    env = lmdb.open(path, subdir=True, map_size=64 << 20)
    datas = [block(50 + i) for i in range(6)]
    with env.begin(write=True) as txn:
        for i, data in enumerate(datas):
            value = pack_value(data, BlockMeta(1, checksum(data), 50 + i))
            txn.put(encode_key(key(i)), bytes(value))
    env.close()
    tier = DiskTier(8 << 20, path=path)
    try:
        assert tier.namespace_usage() == {"ns": (6, sum(range(50, 56)))}
        assert tier.get_many([key(3)]) == [datas[3]]
    finally:
        tier.close()


def test_samples_are_stored_keys_spread_over_namespaces(tmp_path: Path) -> None:
    import random

    tier = DiskTier(64 << 20, path=str(tmp_path / "db"))
    try:
        keys = [(f"ns{i % 3}", os.urandom(32)) for i in range(600)]
        tier.put_many([item(k, b"x" * 10) for k in keys])
        rng = random.Random(5)
        drawn = tier.sample(200, rng)
        assert len(drawn) >= 150 and set(drawn) <= set(keys)
        assert {ns for ns, _ in drawn} == {"ns0", "ns1", "ns2"}
        assert len(set(drawn)) > 100  # spread, not one run
        assert sorted(tier.sample(600, rng)) == sorted(keys)  # n >= len: every key
    finally:
        tier.close()
