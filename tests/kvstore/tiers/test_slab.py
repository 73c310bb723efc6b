"""Slot slab behaviour shared by the host and device tiers: two-phase writes (reserve, publish,
unreserve), extents, slot rounding and non-contiguous blocks."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from kvstore.errors import CapacityError
from kvstore.tiers.device import DeviceTier
from kvstore.tiers.host import HostTier
from kvstore.tiers.slab import Extents, SlabTier
from tests.kvstore.tiers.contract import KiB, block, item, key

SLOT = 4 * KiB


@pytest.fixture(params=["host", "device"])
def slab(request: pytest.FixtureRequest) -> Iterator[SlabTier]:
    tier: SlabTier
    if request.param == "host":
        tier = HostTier(8 * SLOT, slot_bytes=SLOT, pin=False)
    else:
        tier = DeviceTier(8 * SLOT, slot_bytes=SLOT, device="cpu")
    yield tier
    tier.close()


def write_at(tier: SlabTier, extents: Extents, data: bytes) -> None:
    """What a zero-copy client does: write the block's bytes straight into the slab."""
    pos = 0
    for off, length in extents:
        chunk = np.frombuffer(data, np.uint8, length, pos)
        if isinstance(tier, HostTier):
            tier.view(off, length)[:] = chunk.tobytes()
        else:
            assert isinstance(tier, DeviceTier)
            tier.tensor_view(off, length).copy_(torch.from_numpy(chunk.copy()))
        pos += length
    assert pos == len(data)


def test_capacity_is_whole_slots_and_charge_rounds_up() -> None:
    tier = HostTier(8 * SLOT + 100, slot_bytes=SLOT, pin=False)
    assert (tier.num_slots, tier.slab_bytes) == (8, 8 * SLOT)
    assert [tier.charge(n) for n in (0, 1, SLOT, SLOT + 1)] == [0, SLOT, SLOT, 2 * SLOT]
    assert not tier.fits(8 * SLOT + 1)
    tier.close()
    with pytest.raises(ValueError):
        HostTier(SLOT - 1, slot_bytes=SLOT, pin=False)


def test_reserve_is_charged_but_invisible_until_publish(slab: SlabTier) -> None:
    data = block(SLOT + 10)
    extents = slab.reserve(key(1), len(data))
    assert extents == [(0, SLOT + 10)]  # a fresh slab hands out one contiguous run
    assert slab.used_bytes() == 2 * SLOT
    assert not slab.contains(key(1))
    assert slab.get_many([key(1)]) == [None]
    write_at(slab, extents, data)
    slab.publish(key(1))
    assert slab.contains(key(1))
    assert slab.extents(key(1)) == extents
    assert slab.get_many([key(1)]) == [data]
    assert slab.read(key(1)) == data


def test_unreserve_frees_and_is_idempotent(slab: SlabTier) -> None:
    slab.reserve(key(1), 3 * SLOT)
    slab.unreserve(key(1))
    slab.unreserve(key(1))
    assert slab.used_bytes() == 0
    with pytest.raises(KeyError):
        slab.publish(key(1))
    slab.put_many([item(key(2), block(8 * SLOT))])  # every slot is free again


def test_reserve_refusals(slab: SlabTier) -> None:
    slab.reserve(key(1), 6 * SLOT)
    with pytest.raises(CapacityError):
        slab.reserve(key(2), 3 * SLOT)
    with pytest.raises(ValueError):
        slab.reserve(key(1), SLOT)
    with pytest.raises(ValueError):  # a key mid-write cannot also be put
        slab.put_many([item(key(1), block(10))])
    assert slab.used_bytes() == 6 * SLOT
    with pytest.raises(KeyError):
        slab.extents(key(1))


def test_publish_replaces_a_stored_copy(slab: SlabTier) -> None:
    slab.put_many([item(key(1), block(3 * SLOT))])
    new = block(100)
    extents = slab.reserve(key(1), len(new))
    assert slab.used_bytes() == 4 * SLOT  # both copies are charged while the write is open
    write_at(slab, extents, new)
    slab.publish(key(1))
    assert slab.get_many([key(1)]) == [new]
    assert slab.used_bytes() == SLOT


def test_block_across_non_contiguous_slots(slab: SlabTier) -> None:
    slab.put_many([item(key(i), block(SLOT)) for i in range(8)])
    slab.delete([key(1), key(3), key(5)])  # free slots 1, 3 and 5 only
    data = block(2 * SLOT + 100)
    slab.put_many([item(key(9), data)])
    assert slab.extents(key(9)) == [(1 * SLOT, SLOT), (3 * SLOT, SLOT), (5 * SLOT, 100)]
    assert slab.get_many([key(9)]) == [data]
    slab.delete([key(4)])
    slab.delete([key(9)])
    both = block(4 * SLOT)
    slab.put_many([item(key(10), both)])  # slots 1, 3, 4, 5: neighbours merge
    assert slab.extents(key(10)) == [(1 * SLOT, SLOT), (3 * SLOT, 3 * SLOT)]
    assert slab.read(key(10)) == both


def test_empty_block(slab: SlabTier) -> None:
    slab.put_many([item(key(1), b"")])
    assert slab.contains(key(1))
    assert slab.get_many([key(1)]) == [b""]
    assert slab.extents(key(1)) == []
    assert slab.used_bytes() == 0


def test_closed_slab_refuses_writes(slab: SlabTier) -> None:
    slab.close()
    with pytest.raises(RuntimeError):
        slab.put_many([item(key(1), block(10))])
    with pytest.raises(RuntimeError):
        slab.reserve(key(1), 10)


def test_batched_reserve_and_publish_are_all_or_nothing(slab: SlabTier) -> None:
    with pytest.raises(CapacityError):
        slab.reserve_many([(key(1), 4 * SLOT), (key(2), 5 * SLOT)])
    assert slab.used_bytes() == 0 and slab.reserve(key(1), SLOT)  # nothing was kept
    with pytest.raises(ValueError):
        slab.reserve_many([(key(2), 1), (key(2), 1)])
    blocks = {key(2): block(10), key(3): block(2 * SLOT)}
    extents = slab.reserve_many([(k, len(v)) for k, v in blocks.items()])
    for data, ext in zip(blocks.values(), extents, strict=True):
        write_at(slab, ext, data)
    with pytest.raises(KeyError):  # key(4) was never reserved: nothing is published
        slab.publish_many([key(2), key(3), key(4)])
    assert not slab.contains(key(2))
    slab.publish_many([key(2), key(3)])
    assert slab.get_many([key(2), key(3)]) == list(blocks.values())
    assert slab.used_bytes() == 4 * SLOT  # key(1) is still reserved


def test_put_many_accepts_wide_item_buffers(slab: SlabTier) -> None:
    words = np.arange(3000, dtype=np.int32)  # 12000 bytes as 3000 items
    slab.put_many([(key(1), memoryview(words.data), item(key(1), b"")[2])])
    assert slab.get_many([key(1)]) == [words.tobytes()]
    assert slab.used_bytes() == slab.charge(12000)


def test_random_churn_keeps_every_slot_accounted_for(slab: SlabTier) -> None:
    rng = np.random.default_rng(7)
    stored: dict[tuple[str, bytes], bytes] = {}
    for step in range(300):
        k = key(int(rng.integers(0, 12)))
        op = rng.integers(0, 4)
        size = int(rng.integers(0, 3 * SLOT))
        try:
            if op == 0:
                data = block(size)
                slab.put_many([item(k, data)])
                stored[k] = data
            elif op == 1:
                slab.delete([k])
                stored.pop(k, None)
            else:
                data = block(size)
                extents = slab.reserve(k, size)
                write_at(slab, extents, data)
                if op == 2:
                    slab.publish(k)
                    stored[k] = data
                else:
                    slab.unreserve(k)
        except CapacityError:
            pass
        slab.check_integrity()
        assert slab.used_bytes() == sum(slab.charge(len(v)) for v in stored.values()), step
    assert slab.get_many(list(stored)) == list(stored.values())
