"""Block gather/scatter: every backend agrees with the torch reference, for every dtype."""

from __future__ import annotations

import pytest
import torch

from engines.decoder import kernels


@pytest.fixture(params=["numpy", "numba"])
def backend(request: pytest.FixtureRequest):
    pytest.importorskip(request.param)
    kernels.set_backend(request.param)
    yield request.param
    kernels.set_backend("numpy")


def reference_gather(cache: torch.Tensor, ids: list[int]) -> list[bytes]:
    return [cache[i].contiguous().view(torch.uint8).numpy().tobytes() for i in ids]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gather_then_scatter_round_trips(backend: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(10, 2, 2, 4, 2, 8, generator=g).to(dtype)
    ids = [7, 0, 3, 3]
    got = kernels.gather_blocks(cache, ids)
    assert [bytes(b) for b in got] == reference_gather(cache, ids)
    snapshot = [bytes(b) for b in got]
    cache[7].zero_()  # the gathered bytes are a copy, not a view of the cache
    assert [bytes(b) for b in got] == snapshot

    other = torch.zeros_like(cache)
    kernels.scatter_blocks(other, [1, 5], snapshot[:2])
    assert torch.equal(other[5], cache[0])
    assert other[1].view(torch.uint8).numpy().tobytes() == snapshot[0]
    assert torch.count_nonzero(other[[0, 2, 3, 4, 6, 7, 8, 9]]) == 0


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="numba"):
        kernels.set_backend("triton")


def test_scatter_refuses_wrong_sizes_before_writing() -> None:
    cache = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="64 bytes"):
        kernels.scatter_blocks(cache, [0, 1], [b"\x01" * 64, b"\x01" * 63])
    assert torch.count_nonzero(cache) == 0
