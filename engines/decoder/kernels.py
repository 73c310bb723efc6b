"""Block gather/scatter between the paged cache and kvstore's byte buffers.

A block is one row of the block-major cache (see ``paged_kv``), so both directions are row
copies. The torch version is the reference and the default. A numba version (CPU only) is
chosen with ``set_backend("numba")`` (the CLI's ``--kernels numba``); numba is imported only
then, and a machine without it fails with a clear error rather than at import. On CUDA the
torch path gathers on the device and makes one device-to-host copy for the whole batch, which
is what a custom kernel would do too, so no cupy kernel is needed (see bench results).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

BACKENDS = ("torch", "numba")
_backend = "torch"
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
    mv = memoryview(flat).cast("B")
    size = len(mv) // n if n else 0
    return [mv[i * size:(i + 1) * size] for i in range(n)]


def gather_blocks(cache: torch.Tensor, ids: Sequence[int]) -> list[memoryview]:
    """Bytes of cache blocks ``ids`` as views into one fresh host buffer (safe to keep: later
    cache writes do not change them)."""
    if not ids:
        return []
    if cache.is_cuda or _backend == "torch":
        index = torch.as_tensor(ids, dtype=torch.long, device=cache.device)
        rows = cache.index_select(0, index).view(torch.uint8).reshape(len(ids), -1)
        return _split(rows.cpu().numpy(), len(ids))
    src = _rows(cache)
    out = np.empty((len(ids), src.shape[1]), dtype=np.uint8)
    _numba()[0](src, np.asarray(ids, dtype=np.int64), out)
    return _split(out, len(ids))


def scatter_blocks(cache: torch.Tensor, ids: Sequence[int], data: Sequence[bytes]) -> None:
    """Write ``data[i]`` (exactly one block's bytes each) into cache block ``ids[i]``."""
    if not ids:
        return
    if cache.is_cuda or _backend == "torch":
        buf = np.frombuffer(b"".join(data), dtype=np.uint8)
        rows = torch.from_numpy(buf.copy()).view(cache.dtype).view(len(ids), *cache.shape[1:])
        index = torch.as_tensor(ids, dtype=torch.long, device=cache.device)
        cache.index_copy_(0, index, rows.to(cache.device, non_blocking=True))
        return
    dst = _rows(cache)
    srcs = [np.frombuffer(d, dtype=np.uint8) for d in data]
    scatter = _numba()[1]
    for i, s in zip(ids, srcs, strict=True):
        scatter(dst, i, s)


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
