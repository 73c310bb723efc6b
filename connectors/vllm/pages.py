"""The engine's paged KV tensors seen as whole blocks of bytes.

A stored block is the concatenation, in layer order, of that block's page in every layer,
copied byte for byte. Pages are never reinterpreted, so whatever packing the attention backend
uses inside a page (CPU: ``[num_kv_heads, block_size, 2 * head_size]`` with ISA-dependent
tiling; CUDA: K and V planes; Mamba: the layer's state tensors packed in an ``int8`` page
``[blocks, 1, 1, state bytes]`` whose rows lie a padded stride apart) round-trips exactly. The
only thing this module needs to know about a layer's tensor is which dimension indexes blocks,
found as the one whose size is the engine's block count.

A segment of a hybrid model (:mod:`connectors.vllm.segments`) spans several KV cache groups,
each with its own block table: a stored block is then the page of every layer at one position,
each layer's page taken from its own group's block. ``groups`` names each layer's group, and
the copies take one block id list per group (``block_ids`` for the first, ``extra_ids`` for
the others).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class _Layer:
    name: str
    tensor: torch.Tensor
    block_dim: int
    page_bytes: int
    group: int = 0


def _per_group(block_ids: Sequence[int], extra_ids: Sequence[Sequence[int]]) \
        -> list[Sequence[int]]:
    groups = [block_ids, *extra_ids]
    if any(len(g) != len(block_ids) for g in groups):
        raise ValueError(f"block id lists of lengths {[len(g) for g in groups]} differ")
    return groups


class PagedKV:
    """Block-granular copies between the engine's KV pages and flat byte buffers.

    Built once from ``register_kv_caches``; it keeps references to the engine's tensors, never
    copies of them. ``gather`` and ``scatter`` are the only paths that touch page bytes.
    """

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int,
                 groups: dict[str, int] | None = None) -> None:
        """``groups`` maps each layer to its group's position (all 0 when None). Raises
        ``ValueError`` when a layer has no dimension of size ``num_blocks`` or the layers
        disagree on page size."""
        if not kv_caches:
            raise ValueError("no KV cache tensors to register")
        layers: list[_Layer] = []
        for name, tensor in kv_caches.items():
            if not isinstance(tensor, torch.Tensor):  # say, separate Mamba state tensors
                raise ValueError(f"layer {name}: KV cache is a {type(tensor).__name__}, not "
                                 "one tensor of pages")
            dims = [d for d, size in enumerate(tensor.shape) if size == num_blocks]
            if not dims:
                raise ValueError(
                    f"layer {name}: KV tensor of shape {tuple(tensor.shape)} has no block "
                    f"dimension of size {num_blocks}"
                )
            # CPU pages are [blocks, ...]; CUDA's FlashAttention pages are [2, blocks, ...].
            kv_planes = tensor.dim() > 1 and tensor.shape[0] == 2 and tensor.shape[1] == num_blocks
            dim = 1 if kv_planes and tensor.shape[0] != num_blocks else dims[0]
            page_bytes = tensor.numel() // num_blocks * tensor.element_size()
            layers.append(_Layer(name, tensor, dim, page_bytes, (groups or {}).get(name, 0)))
        sizes = {layer.page_bytes for layer in layers}
        if len(sizes) != 1:
            raise ValueError(f"layers have different page sizes {sorted(sizes)}")
        self._layers = layers
        self.num_groups = 1 + max(layer.group for layer in layers)
        self.num_blocks = num_blocks
        self.page_bytes = layers[0].page_bytes
        self.block_bytes = self.page_bytes * len(layers)
        self.device = layers[0].tensor.device
        self.dtype = layers[0].tensor.dtype
        # CPU pages that are each one contiguous run: uint8 numpy views [num_blocks, page]
        # of the engine's tensors, copied page by page (no index tensors, no temporaries)
        self._flat: list[np.ndarray] | None = None
        if self.device.type == "cpu" and all(
            la.block_dim == 0 and la.tensor.is_contiguous() for la in layers
        ):
            self._flat = [la.tensor.view(num_blocks, -1).view(torch.uint8).numpy()
                          for la in layers]

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    @property
    def page_shape(self) -> tuple[int, ...]:
        """The shape of one block's page in one layer (the block dimension removed)."""
        first = self._layers[0]
        shape = list(first.tensor.shape)
        del shape[first.block_dim]
        return tuple(shape)

    def gather(self, block_ids: Sequence[int], out: torch.Tensor | None = None,
               extra_ids: Sequence[Sequence[int]] = ()) -> torch.Tensor:
        """A ``uint8`` CPU tensor ``[len(block_ids), block_bytes]`` (``out`` if given, else a
        new one): row ``i`` is block ``block_ids[i]`` (of the other groups:
        ``extra_ids[k][i]``). The copy is a snapshot: the pages may be reused right after."""
        n = len(block_ids)
        ids = _per_group(block_ids, extra_ids)
        if out is None:
            out = torch.empty((n, self.block_bytes), dtype=torch.uint8)
        elif tuple(out.shape) != (n, self.block_bytes) or out.dtype != torch.uint8 \
                or not out.is_contiguous():
            raise ValueError(f"out must be contiguous uint8 [{n}, {self.block_bytes}]")
        if n == 0:
            return out
        pb = self.page_bytes
        if self._flat is not None:
            # Each page is one contiguous run: copy it straight to its place in the row. One
            # pass over the bytes instead of index_select's extra one (memory bandwidth is
            # what a save costs the engine thread).
            rows = out.numpy()
            for i, src in enumerate(self._flat):
                for j, b in enumerate(ids[self._layers[i].group]):
                    rows[j, i * pb : (i + 1) * pb] = src[b]
            return out
        idx = [torch.tensor(g, dtype=torch.long, device=self.device) for g in ids]
        for i, layer in enumerate(self._layers):
            pages = layer.tensor.index_select(layer.block_dim, idx[layer.group]) \
                .movedim(layer.block_dim, 0)
            out[:, i * pb : (i + 1) * pb] = pages.reshape(n, -1).view(torch.uint8).cpu()
        return out

    def scatter(self, block_ids: Sequence[int], data: torch.Tensor,
                extra_ids: Sequence[Sequence[int]] = ()) -> None:
        """Write row ``i`` of ``data`` (``uint8 [len(block_ids), block_bytes]``) into block
        ``block_ids[i]`` of every layer (of the other groups: ``extra_ids[k][i]``). Raises
        ``ValueError`` on a shape mismatch."""
        n = len(block_ids)
        ids = _per_group(block_ids, extra_ids)
        if tuple(data.shape) != (n, self.block_bytes) or data.dtype != torch.uint8:
            raise ValueError(
                f"expected uint8 [{n}, {self.block_bytes}], got {data.dtype} {tuple(data.shape)}"
            )
        if n == 0:
            return
        idx = [torch.tensor(g, dtype=torch.long, device=self.device) for g in ids]
        data = data.to(self.device)
        pb = self.page_bytes
        for i, layer in enumerate(self._layers):
            shape = list(layer.tensor.shape)
            del shape[layer.block_dim]
            cols = data[:, i * pb : (i + 1) * pb]
            try:
                # A strided view, no copy: index_copy_ below is the only pass over the bytes
                # (each full copy of a 2k-token prompt's KV costs tens of milliseconds).
                pages = cols.view(layer.tensor.dtype)
            except RuntimeError:  # rows not aligned to the element size
                pages = cols.contiguous().view(layer.tensor.dtype)
            src = pages.reshape(n, *shape).movedim(0, layer.block_dim)
            layer.tensor.index_copy_(layer.block_dim, idx[layer.group], src)

    def scatter_extents(
        self,
        block_ids: Sequence[int],
        src: np.ndarray,
        extents: Sequence[Sequence[Sequence[int]]],
        buf: torch.Tensor,
        extra_ids: Sequence[Sequence[int]] = (),
    ) -> None:
        """Write block ``block_ids[i]``, whose bytes lie at ``extents[i]`` (``[(offset,
        length), ...]``) in the flat ``uint8`` array ``src`` (the store's shared slab), into
        every layer. CPU pages are copied straight from ``src``, one pass over the bytes;
        other pages go through the first rows of ``buf`` (``uint8 [>= n, block_bytes]``) and
        :meth:`scatter`. Raises ``ValueError`` for extents that do not add up to a block or
        fall outside ``src``, before copying anything."""
        n = len(block_ids)
        ids = _per_group(block_ids, extra_ids)
        if len(extents) != n:
            raise ValueError(f"{n} pages for {len(extents)} blocks")
        for ext in extents:
            if sum(length for _, length in ext) != self.block_bytes or any(
                off < 0 or length < 0 or off + length > src.size for off, length in ext
            ):
                raise ValueError(f"extents {list(ext)} do not hold a block of "
                                 f"{self.block_bytes} bytes inside a slab of {src.size}")
        if self._flat is None:
            rows = buf[:n].numpy()
            for i, ext in enumerate(extents):
                pos = 0
                for off, length in ext:
                    rows[i, pos : pos + length] = src[off : off + length]
                    pos += length
            self.scatter(block_ids, buf[:n], extra_ids)
            return
        pb = self.page_bytes
        flat = self._flat
        group = [layer.group for layer in self._layers]
        dst = [np.asarray(g, dtype=np.intp) for g in ids]
        whole = [len(ext) == 1 for ext in extents]  # the block is one run of the slab
        for j, k, stride in _even_runs([ext[0][0] if w else -1 for ext, w in
                                        zip(extents, whole, strict=True)]):
            # k blocks at one stride apart: per layer, one fancy-indexed copy of k pages
            # (per page, Python's loop cost as much as the bytes: 9 ms for 51 MB against 5)
            rows = np.lib.stride_tricks.as_strided(
                src[extents[j][0][0]:], shape=(k, len(flat), pb), strides=(stride, pb, 1),
                writeable=False)
            for layer, pages in enumerate(flat):
                pages[dst[group[layer]][j : j + k]] = rows[:, layer]
        for j, ext in enumerate(extents):
            if whole[j]:
                continue
            pos = 0  # byte of the block: layer pos // pb, at pos % pb in its page
            for off, length in ext:
                while length:
                    layer, at = divmod(pos, pb)
                    take = min(length, pb - at)
                    flat[layer][ids[group[layer]][j], at : at + take] = src[off : off + take]
                    pos, off, length = pos + take, off + take, length - take

    def stack(self, blocks: Sequence[bytes | bytearray | memoryview]) -> torch.Tensor:
        """``uint8 [len(blocks), block_bytes]`` from raw blocks, ready for :meth:`scatter`.
        Raises ``ValueError`` for a block of the wrong size."""
        out = np.empty((len(blocks), self.block_bytes), dtype=np.uint8)
        for i, block in enumerate(blocks):
            row = np.frombuffer(block, dtype=np.uint8)
            if row.size != self.block_bytes:
                raise ValueError(f"block of {row.size} bytes, expected {self.block_bytes}")
            out[i] = row
        return torch.from_numpy(out)


def _even_runs(offsets: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(first, count, stride)`` of each maximal run of blocks whose offsets (``-1``: not one
    piece, left out) step by one stride, as the slab's consecutive slots do."""
    runs: list[tuple[int, int, int]] = []
    j, n = 0, len(offsets)
    while j < n:
        if offsets[j] < 0:
            j += 1
            continue
        k = 1
        stride = offsets[j + 1] - offsets[j] if j + 1 < n and offsets[j + 1] >= 0 else 0
        while stride > 0 and j + k < n and offsets[j + k] - offsets[j + k - 1] == stride:
            k += 1
        runs.append((j, k, stride))
        j += k
    return runs
