"""Device tier: the contract on a CPU tensor slab, plus device-only views; CUDA when present."""

from __future__ import annotations

import pytest
import torch

from kvstore.tiers.device import DeviceTier
from tests.kvstore.tiers.contract import KiB, TierContract, block, item, key


class TestDeviceContract(TierContract):
    def make_tier(self, capacity: int) -> DeviceTier:
        return DeviceTier(capacity, device="cpu")


def test_slab_is_one_preallocated_tensor() -> None:
    tier = DeviceTier(1 << 20, slot_bytes=64 * KiB, device="cpu")
    assert tier.slab_info() == (None, 1 << 20, 64 * KiB)
    data = block(100 * KiB)
    tier.put_many([item(key(1), data)])
    ((off, length),) = tier.extents(key(1))
    assert bytes(tier.tensor_view(off, length).numpy()) == data
    assert tier.read(key(1)) == data
    with pytest.raises(ValueError):
        tier.tensor_view(1 << 20, 1)
    tier.close()
    with pytest.raises(RuntimeError):
        tier.tensor_view(0, 1)


def test_default_device_follows_cuda_availability() -> None:
    tier = DeviceTier(64 * KiB)
    assert tier.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    tier.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_round_trip() -> None:
    tier = DeviceTier(4 << 20, slot_bytes=64 * KiB, device="cuda:0")
    blocks = {key(i): block(n) for i, n in enumerate((1, 64 * KiB, 200 * KiB))}
    tier.put_many([item(k, v) for k, v in blocks.items()])
    tier.delete([key(0)])
    tier.put_many([item(key(9), block(3 * 64 * KiB))])  # lands partly in freed slots
    assert tier.get_many([key(1), key(2)]) == [blocks[key(1)], blocks[key(2)]]
    assert tier.tensor_view(0, 1).device.type == "cuda"
    tier.close()
