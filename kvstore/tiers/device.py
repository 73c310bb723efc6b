"""Device tier: a slot slab in one preallocated ``torch.uint8`` tensor.

On a GPU the slab lives in HBM (``device="cuda:0"``, the default when CUDA is available);
tests and CPU-only hosts run the very same code with ``device="cpu"``. Bytes go in with
``torch.frombuffer`` + ``copy_`` into slab slices and come out as ``bytes``. This module
imports torch, so the registry imports it only when a config names the device tier.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from kvstore.config import DEFAULT_SLOT_BYTES
from kvstore.tiers.base import Buffer
from kvstore.tiers.slab import Extents, SlabInfo, SlabTier
from kvstore.tiers.slots import Entry

# torch.frombuffer warns that a read-only buffer (every ``bytes``) becomes a writable tensor;
# we only ever read from those tensors. torch emits it once per process (TORCH_WARN_ONCE), so
# spend that one emission here, silenced, instead of in a caller's put (a filter would not
# do: test runners and callers reset warning filters).
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.frombuffer(b"\0", dtype=torch.uint8)


class DeviceTier(SlabTier):
    """Device memory slot slab (options: ``slot_bytes``, ``device``)."""

    name = "device"

    def __init__(
        self,
        capacity_bytes: int,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        device: str | None = None,
    ) -> None:
        super().__init__(capacity_bytes, slot_bytes)
        self.device = torch.device(device or ("cuda:0" if torch.cuda.is_available() else "cpu"))
        self._slab: torch.Tensor | None = torch.empty(
            self.slab_bytes, dtype=torch.uint8, device=self.device
        )

    def slab_info(self) -> SlabInfo:
        return SlabInfo(None, self.slab_bytes, self.slot_bytes)

    def tensor_view(self, offset: int, length: int) -> torch.Tensor:
        """A uint8 slice of the slab (no copy), e.g. to copy a block straight into an engine's
        paged KV cache; valid while the block stays stored (pinned) and until :meth:`close`."""
        if offset < 0 or length < 0 or offset + length > self.slab_bytes:
            raise ValueError(f"extent ({offset}, {length}) outside slab of {self.slab_bytes}")
        return self._live()[offset : offset + length]

    def _live(self) -> torch.Tensor:
        if self._slab is None:
            raise RuntimeError("device tier is closed")
        return self._slab

    def _copy_in(self, extents: Extents, data: Buffer) -> None:
        if len(data) == 0:
            return  # frombuffer refuses empty buffers; nothing to copy
        slab, src = self._live(), torch.frombuffer(data, dtype=torch.uint8)
        pos = 0
        for off, length in extents:
            slab[off : off + length].copy_(src[pos : pos + length])
            pos += length

    def _copy_out(self, extents: Extents, size: int) -> bytes:
        slab = self._live()
        # .cpu() is a no-op on a CPU slab and one device-to-host copy on a GPU; tobytes/join is
        # the one copy into the caller-owned bytes.
        if len(extents) == 1:
            off, length = extents[0]
            return slab[off : off + length].cpu().numpy().tobytes()
        return b"".join([slab[off : off + n].cpu().numpy().data for off, n in extents])

    def _copy_out_many(self, entries: Sequence[Entry | None]) -> list[bytes | None]:
        copy = self._copy_out
        return [None if e is None else copy(e[1], e[0]) for e in entries]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._index.clear()
            self._reserved.clear()
            self._slab = None
