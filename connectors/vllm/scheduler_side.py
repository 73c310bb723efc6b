"""The connector's scheduler half: find stored prefixes, plan loads and saves.

Per request it keeps the request object (whose ``block_hashes`` vLLM extends as tokens are
computed), the request's pages as the scheduler outputs reveal them, and how many leading
blocks the store already has or will have once queued saves land. Each step
:meth:`SchedulerSide.build_meta` turns that into loads (blocks the store holds beyond vLLM's own
prefix cache, copied asynchronously into freshly allocated pages) and saves (blocks that this
step's forward pass completes). Nothing here touches KV bytes.

A hybrid model's KV is several segments (:mod:`connectors.vllm.segments`), each its own
namespace behind its own link: a hit is the longest prefix that every full-attention segment
holds whole and every sliding-window segment holds the window before its end (a Mamba
segment: the state at its end), and loads and saves name each segment's pages. vLLM can only
recompute a hybrid request whole when a load fails, so hybrid loads are always asynchronous
(the worker reports the request as failed); Mamba state needs that too, since vLLM copies a
hit's state into the request's running state block before a synchronous load would run.

The lookup is a grant (:mod:`kvstore.client.grant`): the store pins the hit's blocks that its
host tier holds and says where they lie in its shared slab. A load carries those places, so a
worker on the store's host copies them into its pages without asking the store again.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from connectors.vllm.metadata import BlockTransfer, KVStoreConnectorMetadata
from connectors.vllm.req_state import ReqState
from connectors.vllm.save_plan import SavePlan
from connectors.vllm.seg_links import Pins, SegLink, release_all, window_hit
from connectors.vllm.segments import Segment
from connectors.vllm.stats import KVStoreConnectorStats
from connectors.vllm.store_link import StoreLink
from kvstore.client import Grant
from kvstore.keys import BlockHasher

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

# Under "vllm." so that records show in vLLM's own log format and level.
logger = logging.getLogger(f"vllm.{__name__}")


class SchedulerSide:
    """Scheduler-process state of the connector; one instance per engine.

    ``load`` and ``save`` follow vLLM's ``kv_role`` (a consumer only loads, a producer only
    saves). ``hasher`` recomputes the first block of the first plain-text request once, so an
    engine whose hashes differ from kvstore's fails at once instead of never hitting.
    """

    def __init__(
        self,
        link: StoreLink | Sequence[tuple[Segment, StoreLink]],
        block_size: int,
        hasher: BlockHasher,
        *,
        load: bool = True,
        save: bool = True,
        prefetch: bool = True,
        load_async: bool = False,
    ) -> None:
        if isinstance(link, StoreLink):
            self._segs = [SegLink(link)]
        else:
            self._segs = [SegLink(lnk, seg.groups, seg) for seg, lnk in link]
        self._hybrid = len(self._segs) > 1 or any(s.window for s in self._segs)
        self._link = self._segs[0].link
        self._bs = block_size
        self._hasher: BlockHasher | None = hasher
        self._load = load
        self._save = save
        self._prefetch = prefetch
        self.load_async = load_async or self._hybrid
        self._reqs: dict[str, ReqState] = {}
        self._loads: list[BlockTransfer] = []
        # requests with synchronous loads, by the step that planned them: their pins go two
        # steps later, when the load has run even under vLLM's async scheduling (which plans
        # one step ahead of the one executing)
        self._sync_now: list[Pins] = []
        self._sync_steps: deque[list[Pins]] = deque()
        self.stats = KVStoreConnectorStats()
        self._saves = SavePlan(self._segs, block_size, self.stats)

    # -- request arrives ---------------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        """Track ``request`` and start moving its stored blocks to the store's fastest tier
        before the scheduler asks for them."""
        self._reqs[request.request_id] = ReqState(request)
        if self._hasher is not None:
            self._check_hashes(request)
        if self._load and self._prefetch and request.block_hashes:
            for seg in self._segs:
                seg.link.prefetch(request.block_hashes)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        """Tokens the store can supply beyond vLLM's ``num_computed_tokens`` (a whole number
        of blocks; 0 when the store is down or has nothing more). Only a lookup: repeated calls
        for the same request are harmless."""
        st = self._state(request)
        if not self._load or not request.block_hashes:
            return 0
        self.stats.add("lookups")
        release_all(st.grant_pins)  # an earlier lookup's, never loaded
        st.granted_at = time.monotonic()
        hashes = request.block_hashes
        limit = len(hashes)
        if not self.load_async or self._hybrid:
            # the step that loads must compute at least one token: never the whole prompt
            # (and a sliding window's last token gives the logits of the first new one)
            limit = min(limit, (request.num_tokens - 1) // self._bs)
        st.grants = [None] * len(self._segs)
        st.grant_pins = [Pins(seg.link) for seg in self._segs]
        n, tiers = len(hashes), list[str]()
        for i, seg in enumerate(self._segs):  # full attention: the whole prefix
            if not seg.window:
                grant = seg.link.lookup_grant(hashes)
                st.grants[i] = (0, grant)
                st.grant_pins[i].granted = grant.granted(hashes)
                if grant.prefix_blocks < n or not tiers:
                    n, tiers = min(n, grant.prefix_blocks), grant.tiers
        full = n
        n = window_hit(self._segs, hashes, min(n, limit), num_computed_tokens // self._bs)
        if n < full and self._hybrid:
            # Another prompt with this prefix went on differently: later ones will branch here
            # too, so this request stores the windows before it (as vLLM's hybrid cache keeps
            # states at shared-prefix junctions).
            st.branch = full
        st.saved = [max(st.saved[i] if st.saved else 0, n if seg.window else full)
                    for i, seg in enumerate(self._segs)]
        for i, seg in enumerate(self._segs):  # sliding windows: the blocks before the end
            if seg.window and n:
                start = max(0, n - seg.window)
                grant = seg.link.lookup_grant(hashes[start:n])
                st.grants[i] = (start, grant)
                st.grant_pins[i].granted = grant.granted(hashes[start:n])
                if not tiers:
                    tiers = [""] * start + grant.tiers
        st.hit_blocks, st.hit_tiers = n, tiers[:n]
        return max(0, n * self._bs - num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """Plan the load of the ``num_external_tokens`` tokens vLLM accepted, into the pages
        it just allocated. Blocks the lookup's grant located in the store's slab stay pinned
        by it; the others are pinned now. Either way they stay pinned until the worker has
        copied them."""
        st = self._state(request)
        grants, pins = st.grants, st.grant_pins
        st.grants, st.grant_pins = [], []
        if num_external_tokens <= 0 or not grants:
            release_all(pins)
            return
        end = st.hit_blocks
        start = end - (num_external_tokens + self._bs - 1) // self._bs
        ids = blocks.get_block_ids()
        st.load_pins = pins
        for i, seg in enumerate(self._segs):
            self._plan_load(request, st, i, seg, [ids[g] for g in seg.groups], start, end,
                            grants[i], pins[i])
        if not self.load_async:
            self._sync_now.extend(pins)
        self.stats.add("hit_tokens", num_external_tokens)

    def _plan_load(self, request: Request, st: ReqState, i: int, seg: SegLink,
                   ids: list[list[int]], start: int, end: int,
                   grant: tuple[int, Grant] | None, pins: Pins) -> None:
        """Load segment ``i``'s blocks ``start..end`` that vLLM gave pages to (a sliding
        window gets them only for its window before ``end``; null page 0 elsewhere)."""
        where = [b for b in range(start, end) if all(g[b] for g in ids)]
        if not where:
            return
        hashes = [bytes(request.block_hashes[b]) for b in where]
        extents: list[Any] | None = None
        gens: list[int | None] | None = None
        sums: list[int | None] | None = None
        instance = ""
        if grant is not None and grant[1].instance:
            first, g = grant
            extents = [g.extents[b - first] if 0 <= b - first < len(g.extents) else None
                       for b in where]
            if g.gens:
                gens = [g.gens[b - first] if 0 <= b - first < len(g.gens) else None
                        for b in where]
            if g.sums:
                sums = [g.sums[b - first] if 0 <= b - first < len(g.sums) else None
                        for b in where]
            if any(e is not None for e in extents):
                instance = g.instance
            else:
                extents, gens, sums = None, None, None
        # The grant's pins on blocks vLLM already has go with the load's: released now, they
        # would wake the store during this step's forward pass for nothing.
        self._loads.append(BlockTransfer(
            request.request_id, [ids[0][b] for b in where], hashes, notify=self.load_async,
            extents=extents, instance=instance, granted_at=st.granted_at,
            granted_ns=seg.link.namespace, gens=gens, sums=sums, segment=i,
            extra_ids=[[g[b] for b in where] for g in ids[1:]],
        ))
        pins.plain = [h for j, h in enumerate(hashes) if extents is None or extents[j] is None]
        seg.link.pin(pins.plain)

    def hit_tiers(self, request: Request, num_external_tokens: int) -> list[str]:
        """The store tier of each block of the accepted hit, for vLLM's hit-source stats."""
        st = self._reqs.get(request.request_id)
        if st is None:
            return []
        n = (num_external_tokens + self._bs - 1) // self._bs
        return st.hit_tiers[max(0, st.hit_blocks - n) : st.hit_blocks]

    # -- each step ---------------------------------------------------------------------------

    def build_meta(self, so: SchedulerOutput) -> KVStoreConnectorMetadata:
        """This step's loads and saves; resets the pending loads."""
        meta = KVStoreConnectorMetadata(loads=self._loads)
        self._loads = []
        self._sync_steps.append(self._sync_now)
        self._sync_now = []
        if len(self._sync_steps) > 2:
            release_all(self._sync_steps.popleft())
        if self._save:
            self._saves.step(so, self._reqs, meta)
        return meta

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """Unpin the blocks of loads the workers finished (or gave up on)."""
        for req_id in output.finished_recving or ():
            st = self._reqs.get(req_id)
            if st is not None:
                release_all(st.load_pins)

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """Forget ``request``. Its pages can be freed at once: every save was copied out of
        them in ``wait_for_save`` of the step that computed it, before vLLM calls this."""
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            release_all(st.grant_pins)
            release_all(st.load_pins)
        return False, None

    def take_stats(self) -> KVStoreConnectorStats | None:
        return self.stats.take()

    def close(self) -> None:
        for seg in self._segs:
            seg.link.close()

    # -- helpers -----------------------------------------------------------------------------

    def _state(self, request: Request) -> ReqState:
        st = self._reqs.get(request.request_id)
        if st is None:  # the scheduler may skip on_new_request for resumed streaming inputs
            st = self._reqs[request.request_id] = ReqState(request)
        return st

    def _check_hashes(self, request: Request) -> None:
        """Compare vLLM's first block hash with kvstore's once, on a plain-text request."""
        assert self._hasher is not None
        tokens = request.prompt_token_ids or []
        plain = not (request.lora_request or request.mm_features or request.cache_salt)
        if not plain or len(tokens) < self._bs or not request.block_hashes:
            return
        ours = self._hasher.hash_blocks(list(tokens[: self._bs]))[0]
        theirs = bytes(request.block_hashes[0])
        self._hasher = None
        if ours != theirs:
            raise RuntimeError(
                "vLLM's block hashes differ from kvstore's for the same tokens "
                f"({theirs.hex()[:16]}... vs {ours.hex()[:16]}...): check "
                "prefix_caching_hash_algo and PYTHONHASHSEED; refusing to run with a store "
                "that could never hit"
            )
        logger.info("vLLM's block hashes match kvstore's")
