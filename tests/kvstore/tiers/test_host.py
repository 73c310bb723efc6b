"""Host tier: the contract, plus the shared-memory slab seen from a second process."""

from __future__ import annotations

import gc
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kvstore.tiers.host import HostTier
from tests.kvstore.tiers.contract import KiB, TierContract, block, item, key

REPO = Path(__file__).resolve().parents[3]

# A zero-copy client: maps the slab by name, hashes the bytes at some extents and writes a
# deterministic pattern at others, then exits without unlinking.
CLIENT = textwrap.dedent(
    """
    import hashlib, json, random, sys
    from kvstore.tiers.host import attach_slab
    job = json.loads(sys.argv[1])
    shm = attach_slab(job["name"])
    got = b"".join(bytes(shm.buf[o:o + n]) for o, n in job["read"])
    pattern = random.Random(job["seed"]).randbytes(sum(n for _, n in job["write"]))
    pos = 0
    for o, n in job["write"]:
        shm.buf[o:o + n] = pattern[pos:pos + n]
        pos += n
    shm.close()
    print(hashlib.sha256(got).hexdigest())
    """
)


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120
    )


class TestHostContract(TierContract):
    def make_tier(self, capacity: int) -> HostTier:
        return HostTier(capacity, pin=False)


def test_second_process_reads_and_writes_the_slab() -> None:
    import hashlib
    import random

    tier = HostTier(1 << 20, slot_bytes=16 * KiB, pin=False)
    try:
        stored = block(40 * KiB)
        tier.put_many([item(key(1), stored)])
        write_extents = tier.reserve(key(2), 50 * KiB)
        job = {
            "name": tier.slab_info().shm_name,
            "read": tier.extents(key(1)),
            "write": write_extents,
            "seed": 1234,
        }
        proc = run_python(CLIENT, json.dumps(job))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == hashlib.sha256(stored).hexdigest()
        # The client's exit must neither unlink the segment nor warn about it.
        assert proc.stderr == ""
        assert os.path.exists(f"/dev/shm/{tier.shm_name}")
        tier.publish(key(2))
        assert tier.get_many([key(2)]) == [random.Random(1234).randbytes(50 * KiB)]
    finally:
        tier.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_close_unlinks_even_with_a_live_view() -> None:
    tier = HostTier(256 * KiB, pin=False)
    path = f"/dev/shm/{tier.shm_name}"
    assert os.path.exists(path)
    view = tier.view(0, 16)
    view[:4] = b"abcd"
    tier.close()
    assert not os.path.exists(path)
    with pytest.raises(RuntimeError):
        tier.view(0, 1)
    del tier  # collecting the segment object under a live view must not raise BufferError
    gc.collect()
    assert bytes(view[:4]) == b"abcd"  # the mapping lives as long as the view
    view.release()


def test_named_segment_and_name_clash() -> None:
    name = f"kvstore-{os.getpid()}-named"
    tier = HostTier(128 * KiB, slot_bytes=64 * KiB, shm_name=name, pin=False)
    try:
        assert tier.slab_info() == (name, 128 * KiB, 64 * KiB)
        # private to this user whatever the umask
        assert stat.S_IMODE(os.stat(f"/dev/shm/{name}").st_mode) == 0o600
        with pytest.raises(FileExistsError):
            HostTier(128 * KiB, shm_name=name, pin=False)
    finally:
        tier.close()


@pytest.mark.parametrize("close", [True, False])
def test_process_exit_leaves_no_segment_and_no_warning(close: bool) -> None:
    code = textwrap.dedent(
        f"""
        from kvstore.tiers.host import HostTier
        t = HostTier(1 << 20, pin=False)
        t.put_many([(("ns", b"h"), b"x" * 1000, (0, 0, 1000))])
        print(t.shm_name)
        if {close}:
            t.close()
        """
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no resource_tracker "leaked shared_memory" warning
    assert not os.path.exists(f"/dev/shm/{proc.stdout.strip()}")


def test_pinning_follows_cuda() -> None:
    tier = HostTier(128 * KiB)  # pin=True: pinned only when CUDA is present
    try:
        assert (tier.pinned is not None) == torch.cuda.is_available()
        tier.put_many([item(key(1), b"abc")])
        assert tier.get_many([key(1)]) == [b"abc"]
    finally:
        tier.close()


def test_a_slab_larger_than_free_memory_is_refused_before_any_is_reserved() -> None:
    """A memfd has no size limit: reserving more than the free memory would end in the OOM
    killer. The tier refuses it with an error instead, and nothing is left behind."""
    from kvstore.errors import CapacityError
    from kvstore.tiers.segment import memory_available

    room = memory_available()
    if room is None:
        pytest.skip("this machine does not say how much memory is free")
    for name in (None, f"kvs-oom-{os.getpid()}"):
        with pytest.raises(CapacityError, match="lower the host capacity"):
            HostTier(4 * room, shm_name=name, memfd=name is None)
    assert not any(p.name.startswith("kvs-oom-") for p in Path("/dev/shm").iterdir())
