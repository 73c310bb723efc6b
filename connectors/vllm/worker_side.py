"""The connector's worker half: copy blocks between kvstore and the engine's KV pages.

Loads run in ``start_load_kv``. For synchronous loads (``load_mode="sync"``) vLLM calls it
before this step's forward pass, which then reads the pages. For asynchronous loads it comes
after the forward pass: the request they feed waits in ``WAITING_FOR_REMOTE_KVS`` and none of
its pages is read by anyone until :meth:`WorkerSide.get_finished` reports it. Either way the
copy never races attention. A block the scheduler's lookup found in the store's host tier
comes with its place in the store's shared slab, pinned (a grant, see
:mod:`kvstore.client.grant`): the worker copies it from its own mapping of the slab straight
into the pages, with no round trip, then checks the block's generation in the slab: a moved
number (the grant outlived its lease, the slots hold another block) makes the copy a miss,
fetched again or recomputed, never loaded as that block's KV. Any other block is fetched with
``get_into``. A block the
store cannot supply (down, evicted, failed checksum) fails that block and every later one of
the request: vLLM learns them from :meth:`WorkerSide.take_load_errors` and recomputes from the
first one.

Saves are copied out of the pages in ``wait_for_save`` and stored by a background thread:
see :mod:`connectors.vllm.saver`.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from connectors.vllm.layout import KVLayout
from connectors.vllm.metadata import BlockTransfer, KVStoreConnectorMetadata
from connectors.vllm.pages import PagedKV
from connectors.vllm.saver import Saver
from connectors.vllm.stats import KVStoreConnectorStats
from connectors.vllm.store_link import StoreLink, StoreUnavailable
from kvstore.checksum import checksum_parts

if TYPE_CHECKING:
    from collections.abc import Callable

# Under "vllm." so that records show in vLLM's own log format and level.
logger = logging.getLogger(f"vllm.{__name__}")

LOAD_CHUNK_BYTES = 256 << 20  # loads go through a reused buffer of at most this size


class WorkerSide:
    """Worker-process state of the connector for one segment of the KV cache (all of it for a
    plain model); one per segment and worker (tensor-parallel rank).

    ``make_link`` builds a :class:`StoreLink` for this rank's namespace; the worker opens two,
    one for loads on the engine thread and one for the save thread, so a slow save never holds
    up a load. ``groups`` maps each layer to its group's position in the segment; ``save``
    is False on ranks that only read what rank 0 stores (MLA's latent is the same on all).
    """

    def __init__(
        self, layout: KVLayout, make_link: Callable[[], StoreLink], flush_timeout_s: float,
        *, groups: dict[str, int] | None = None, save: bool = True,
    ) -> None:
        self.layout = layout
        self._groups = groups
        self._save_enabled = save
        self._failed_reqs: set[str] = set()
        self._flush_timeout_s = flush_timeout_s
        self._make_link = make_link
        self._pages: PagedKV | None = None
        self._load_link: StoreLink | None = None
        self._finished_loads: set[str] = set()
        self._load_buf: torch.Tensor | None = None  # reused: a fresh one faults in every page
        self._load_errors: set[int] = set()
        self._stats = KVStoreConnectorStats()
        self._stats_lock = threading.Lock()
        self._saver: Saver | None = None  # from register_kv_caches, on ranks that save

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], num_blocks: int) -> None:
        """Adopt the engine's KV tensors and register this rank's namespace.

        Raises ``ValueError`` when the tensors do not hold the blocks the config promised
        (the namespace would then describe bytes it does not hold), and
        :class:`~connectors.vllm.store_link.NamespaceMismatch` when the store holds the
        namespace with another identity. An unreachable store is only logged: the connector
        registers once it comes back.
        """
        pages = PagedKV(kv_caches, num_blocks, self._groups)
        lay = self.layout
        if pages.num_layers != lay.num_layers or pages.block_bytes != lay.block_bytes:
            raise ValueError(
                f"KV tensors hold {pages.num_layers} layers x {pages.page_bytes} bytes per "
                f"block, but the model config implies {lay.num_layers} x {lay.page_bytes} "
                f"({lay.dtype}, {lay.num_kv_heads} KV heads, head_dim {lay.head_dim}, "
                f"block_size {lay.block_size})"
            )
        self._pages = pages
        self._load_link = self._make_link()
        if not self._load_link.register():
            logger.warning("kvstore unreachable at start; the connector will retry")
        if self._save_enabled:
            self._saver = Saver(pages, self._make_link)
        # A process that exits right after its last request must still store that request's
        # blocks: atexit runs before daemon threads are stopped, so flush there too.
        atexit.register(self.shutdown, self._flush_timeout_s)
        logger.info(
            "KVStoreConnector: %d layers, page %s %s, %d bytes per block, namespace %s",
            pages.num_layers, pages.page_shape, lay.dtype, pages.block_bytes,
            self._load_link.namespace,
        )

    # -- loads -------------------------------------------------------------------------------

    def start_load(self, meta: KVStoreConnectorMetadata) -> None:
        """Copy every planned load into its pages; record finished requests and failures."""
        for transfer in meta.loads:
            self._load_one(transfer)
            if transfer.notify:
                self._finished_loads.add(transfer.req_id)

    def _load_one(self, t: BlockTransfer) -> None:
        assert self._pages is not None and self._load_link is not None
        start = time.perf_counter()
        pages = self._pages
        step = max(1, LOAD_CHUNK_BYTES // pages.block_bytes)
        ok = self._load_granted(t, step)
        todo = [i for i, copied in enumerate(ok) if not copied]
        pos = 0
        while pos < len(todo):  # the rest through the store, a chunk at a time
            idx = todo[pos : pos + step]
            data = self._load_buffer(len(idx))
            try:
                found = self._load_link.get_into([t.hashes[i] for i in idx],
                                                 [memoryview(r.numpy()) for r in data])
            except StoreUnavailable:
                found = []
            run = 0
            while run < len(idx) and run < len(found) and found[run]:
                run += 1
            if run:
                pages.scatter([t.block_ids[i] for i in idx[:run]], data[:run],
                              [[ids[i] for i in idx[:run]] for ids in t.extra_ids])
            for i in idx[:run]:
                ok[i] = True
            pos += run
            if run < len(idx):
                break
        # Only a leading run of blocks is usable: KV after a missing block would describe a
        # prefix the engine never computed.
        good = ok.index(False) if False in ok else len(ok)
        failed = t.block_ids[good:]
        if failed:
            self._load_errors.update(failed)
            self._failed_reqs.add(t.req_id)
            logger.warning(
                "request %s: %d of %d stored blocks could not be loaded; vLLM recomputes them",
                t.req_id, len(failed), len(t.block_ids),
            )
        with self._stats_lock:
            self._stats.add("loaded_blocks", good)
            self._stats.add("loaded_bytes", good * self._pages.block_bytes)
            self._stats.add("load_errors", len(failed))
            self._stats.add("load_s", time.perf_counter() - start)

    def _load_granted(self, t: BlockTransfer, step: int) -> list[bool]:
        """Copy the blocks the scheduler's grant located straight from the store's slab
        (no round trip); which ones were copied. None is copied when the grant is for
        another namespace (this is not tensor-parallel rank 0) or server instance (restarted
        since), has aged past half its lease, or this process cannot map the slab: the
        caller then fetches every block."""
        assert self._pages is not None and self._load_link is not None
        link = self._load_link
        ok = [False] * len(t.hashes)
        if not t.extents or not t.instance or t.granted_ns != link.namespace \
                or time.monotonic() - t.granted_at > link.cfg.lease_s / 2:
            return ok
        slab = link.granted_slab(t.instance)
        if slab is None or time.monotonic() - t.granted_at > link.lease_s / 2:
            return ok
        idx = [i for i, ext in enumerate(t.extents) if ext is not None]
        src = np.frombuffer(slab.buf, dtype=np.uint8)
        bad = 0
        try:
            for lo in range(0, len(idx), step):
                part = idx[lo : lo + step]
                self._pages.scatter_extents(
                    [t.block_ids[i] for i in part], src, [t.extents[i] or [] for i in part],
                    self._load_buffer(len(part)), [[ids[i] for i in part] for ids in t.extra_ids],
                )
                for i in part:  # fenced: copied after the grant's slots were freed, refetch
                    ok[i] = t.gens is None or slab.current(t.extents[i] or [], t.gens[i])
                    # the bytes copied must still be the block's (a late writer may have
                    # landed on them): hashed in the slab after the copy, as the generation
                    csum = t.sums[i] if t.sums else None
                    if ok[i] and csum is not None and checksum_parts(
                            [slab.buf[o : o + n] for o, n in t.extents[i] or []]) != csum:
                        ok[i] = False
                        bad += 1
        except ValueError as exc:  # extents that cannot be a block of ours: fetch instead
            logger.warning("request %s: unusable grant from kvstore (%s)", t.req_id, exc)
        finally:
            del src  # a live view would keep the slab mapped after the client lets it go
        if bad:  # fetched again below: the store's own read drops a block that is bad
            logger.warning("request %s: %d granted blocks failed their checksum after the "
                           "copy; fetching them again", t.req_id, bad)
        return ok

    def _load_buffer(self, n: int) -> torch.Tensor:
        """``uint8 [n, block_bytes]`` rows of a buffer kept between loads. Copying a 2k-token
        prompt's KV into fresh memory cost three times what it costs into memory touched
        before (every page faulted in, 62 ms against 19 ms for 51 MB here)."""
        assert self._pages is not None
        buf = self._load_buf
        if buf is None or buf.shape[0] < n:
            buf = torch.zeros((n, self._pages.block_bytes), dtype=torch.uint8)  # touched once
            self._load_buf = buf
        return buf[:n]

    def get_finished(self) -> set[str]:
        """Requests whose loads ended (copied or failed) since the last call."""
        done, self._finished_loads = self._finished_loads, set()
        return done

    def take_load_errors(self) -> set[int]:
        """Pages whose loads failed since the last call; vLLM recomputes from them."""
        errors, self._load_errors = self._load_errors, set()
        return errors

    def take_failed_requests(self) -> set[str]:
        """Requests with a load that failed since the last call (for hybrid models, whose
        page ids vLLM cannot map back to requests: it recomputes the whole request)."""
        failed, self._failed_reqs = self._failed_reqs, set()
        return failed

    # -- saves -------------------------------------------------------------------------------

    def save(self, meta: KVStoreConnectorMetadata) -> None:
        """Snapshot the pages named by this step's saves and queue them for storing."""
        if self._saver is not None:
            self._saver.save(meta)

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for queued saves to be stored; True when none is left."""
        return self._saver is None or self._saver.flush(timeout_s)

    # -- stats and shutdown ------------------------------------------------------------------

    def take_stats(self) -> KVStoreConnectorStats | None:
        with self._stats_lock:
            stats = self._stats.take()
        saves = self._saver.take_stats() if self._saver is not None else None
        if stats is None or saves is None:
            return stats or saves
        stats.aggregate(saves)
        return stats

    def shutdown(self, timeout_s: float) -> None:
        """Store what is queued (up to ``timeout_s``), then stop the save thread. Idempotent:
        vLLM's shutdown and the exit hook may both call it."""
        if self._saver is not None:
            self._saver.stop(timeout_s)
            self._saver = None
        if self._load_link is not None:
            self._load_link.close()
            self._load_link = None
