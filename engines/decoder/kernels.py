"""Block gather/scatter between the paged cache and kvstore's byte buffers.

A block is one row of the block-major cache (see ``paged_kv``), so both directions are row
copies. On CUDA, torch gathers on the device and makes one copy through pinned host memory for
the whole batch, which is what a custom cupy kernel would do too. On the CPU the cache's memory
is viewed as a numpy ``[num_blocks, block_bytes]`` array and rows are copied one by one
("numpy", the default): measured on a shared 2-core machine, torch's ``index_select`` into a
fresh buffer ran 5-10x slower (its intra-op threads fight for the cores), and a parallel numba
kernel (``set_backend("numba")``, the CLI's ``--kernels numba``) only matched the row copies,
both bound by page faults of the fresh output buffer (``bench/bench_engine.py`` measures all
three). numba is imported only when chosen. Tests check every path against torch indexing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from kvstore.types import Buffer

BACKENDS = ("numpy", "numba")
_backend = "numpy"
_numba_fns: tuple[Callable[..., Any], Callable[..., Any]] | None = None


def set_backend(name: str) -> None:
    """Select the CPU copy implementation; raises ``ValueError`` for an unknown name and
    ``ImportError`` if numba is asked for but missing."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; known: {', '.join(BACKENDS)}")
    if name == "numba":
        _numba()
    _backend = name


def _rows(cache: torch.Tensor) -> np.ndarray:
    """The CPU cache as a ``[num_blocks, block_bytes]`` uint8 array sharing its memory."""
    return cache.view(torch.uint8).reshape(cache.shape[0], -1).numpy()


def _split(flat: np.ndarray, n: int) -> list[memoryview]:
    mv = flat.reshape(-1).data  # uint8, so already byte-addressed
    size = len(mv) // n if n else 0
    return [mv[i * size:(i + 1) * size] for i in range(n)]


def gather_blocks(cache: torch.Tensor, ids: Sequence[int]) -> list[memoryview]:
    """Bytes of cache blocks ``ids`` as views into one fresh host buffer (safe to keep: later
    cache writes do not change them)."""
    if not ids:
        return []
    n, row = len(ids), block_nbytes(cache)
    if cache.is_cuda:
        # gather on the device, then one device-to-host copy of the whole batch
        index = torch.as_tensor(ids, dtype=torch.long, device=cache.device)
        rows = cache.index_select(0, index).view(torch.uint8).reshape(n, row)
        host = torch.empty((n, row), dtype=torch.uint8, pin_memory=True)
        host.copy_(rows)
        return _split(host.numpy(), n)
    src = _rows(cache)
    out = np.empty((n, row), dtype=np.uint8)
    if _backend == "numba":
        _numba()[0](src, np.asarray(ids, dtype=np.int64), out)
    else:
        for j, i in enumerate(ids):
            out[j] = src[i]
    return _split(out, n)


def scatter_blocks(cache: torch.Tensor, ids: Sequence[int], data: Sequence[Buffer]) -> None:
    """Write ``data[i]`` (exactly one block's bytes each) into cache block ``ids[i]``. Raises
    ``ValueError`` on a size mismatch before writing anything."""
    if not ids:
        return
    row = block_nbytes(cache)
    srcs = [np.frombuffer(d, dtype=np.uint8) for d in data]
    if len(srcs) != len(ids) or any(s.size != row for s in srcs):
        raise ValueError(f"scatter_blocks needs {len(ids)} buffers of {row} bytes")
    if cache.is_cuda:
        host = torch.empty((len(ids), row), dtype=torch.uint8, pin_memory=True)
        stage = host.numpy()
        for i, s in enumerate(srcs):
            stage[i] = s
        index = torch.as_tensor(ids, dtype=torch.long, device=cache.device)
        rows = host.to(cache.device, non_blocking=True).view(cache.dtype)
        cache.index_copy_(0, index, rows.view(len(ids), *cache.shape[1:]))
        torch.cuda.current_stream(cache.device).synchronize()  # host buffer is freed after
        return
    dst = _rows(cache)
    if _backend == "numba":
        scatter = _numba()[1]
        for i, s in zip(ids, srcs, strict=True):
            scatter(dst, i, s)
    else:
        for i, s in zip(ids, srcs, strict=True):
            dst[i] = s  # a numpy row copy into the cache's own memory


def row_views(cache: torch.Tensor, ids: Sequence[int]) -> list[memoryview]:
    """Writable views of CPU cache blocks ``ids`` (for stores that copy into buffers). A block
    left half-written by a failed copy is harmless: the caller only keeps blocks reported
    complete and recomputes the rest."""
    rows = _rows(cache)
    return [memoryview(rows[i]) for i in ids]


def block_nbytes(cache: torch.Tensor) -> int:
    return cache[0].numel() * cache.element_size()


def _numba() -> tuple[Callable[..., Any], Callable[..., Any]]:
    global _numba_fns
    if _numba_fns is None:
        import numba

        @numba.njit(parallel=True, nogil=True, cache=False)
        def gather(src: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
            for i in numba.prange(ids.shape[0]):
                out[i, :] = src[ids[i], :]

        @numba.njit(nogil=True, cache=False)
        def scatter(dst: np.ndarray, i: int, row: np.ndarray) -> None:
            dst[i, :] = row

        _numba_fns = (gather, scatter)
    return _numba_fns
