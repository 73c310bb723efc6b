"""The connector's scheduler half: find stored prefixes, plan loads and saves.

Per request it keeps the request object (whose ``block_hashes`` vLLM extends as tokens are
computed), the request's pages as the scheduler outputs reveal them, and how many leading
blocks the store already has or will have once queued saves land. Each step
:meth:`SchedulerSide.build_meta` turns that into loads (blocks the store holds beyond vLLM's own
prefix cache, copied asynchronously into freshly allocated pages) and saves (blocks that this
step's forward pass completes). Nothing here touches KV bytes.

The lookup is a grant (:mod:`kvstore.client.grant`): the store pins the hit's blocks that its
host tier holds and says where they lie in its shared slab. A load carries those places, so a
worker on the store's host copies them into its pages without asking the store again.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from connectors.vllm.metadata import BlockTransfer, KVStoreConnectorMetadata
from connectors.vllm.stats import KVStoreConnectorStats
from connectors.vllm.store_link import StoreLink
from kvstore.client import Grant
from kvstore.keys import BlockHasher
from kvstore.types import BlockHash

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

# Under "vllm." so that records show in vLLM's own log format and level.
logger = logging.getLogger(f"vllm.{__name__}")


@dataclass(slots=True)
class _Pins:
    """Pins the scheduler holds in the store: ``plain`` from ``pin``, ``granted`` by a lookup.
    Pins are counted, so each is released exactly once: :meth:`release` empties the object,
    and whoever still holds it afterwards releases nothing."""

    plain: list[bytes] = field(default_factory=list)
    granted: list[BlockHash] = field(default_factory=list)

    def release(self, link: StoreLink) -> None:
        plain, granted = self.plain, self.granted
        self.plain, self.granted = [], []
        link.release(plain)
        link.release_grant(granted)


@dataclass(slots=True)
class _Req:
    request: Request
    block_ids: list[int] = field(default_factory=list)
    stored_blocks: int = 0  # leading blocks the store holds or a queued save will hold
    hit_blocks: int = 0  # leading blocks the last lookup found
    hit_tiers: list[str] = field(default_factory=list)
    grant: Grant | None = None  # the last lookup's, until a load takes it
    granted_at: float = 0.0
    grant_pins: _Pins = field(default_factory=_Pins)  # the grant's, while no load holds them
    load_pins: _Pins = field(default_factory=_Pins)  # held for the in-flight load


class SchedulerSide:
    """Scheduler-process state of the connector; one instance per engine.

    ``load`` and ``save`` follow vLLM's ``kv_role`` (a consumer only loads, a producer only
    saves). ``hasher`` recomputes the first block of the first plain-text request once, so an
    engine whose hashes differ from kvstore's fails at once instead of never hitting.
    """

    def __init__(
        self,
        link: StoreLink,
        block_size: int,
        hasher: BlockHasher,
        *,
        load: bool = True,
        save: bool = True,
        prefetch: bool = True,
        load_async: bool = False,
    ) -> None:
        self._link = link
        self._bs = block_size
        self._hasher: BlockHasher | None = hasher
        self._load = load
        self._save = save
        self._prefetch = prefetch
        self.load_async = load_async
        self._reqs: dict[str, _Req] = {}
        self._loads: list[BlockTransfer] = []
        # requests with synchronous loads, by the step that planned them: their pins go two
        # steps later, when the load has run even under vLLM's async scheduling (which plans
        # one step ahead of the one executing)
        self._sync_now: list[_Pins] = []
        self._sync_steps: deque[list[_Pins]] = deque()
        self.stats = KVStoreConnectorStats()

    # -- request arrives ---------------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        """Track ``request`` and start moving its stored blocks to the store's fastest tier
        before the scheduler asks for them."""
        self._reqs[request.request_id] = _Req(request)
        if self._hasher is not None:
            self._check_hashes(request)
        if self._load and self._prefetch and request.block_hashes:
            self._link.prefetch(request.block_hashes)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        """Tokens the store can supply beyond vLLM's ``num_computed_tokens`` (a whole number
        of blocks; 0 when the store is down or has nothing more). Only a lookup: repeated calls
        for the same request are harmless."""
        st = self._state(request)
        if not self._load or not request.block_hashes:
            return 0
        self.stats.add("lookups")
        st.grant_pins.release(self._link)  # an earlier lookup's, never loaded
        st.granted_at = time.monotonic()
        grant = self._link.lookup_grant(request.block_hashes)
        st.grant = grant
        st.grant_pins.granted = grant.granted(request.block_hashes)
        n, tiers = grant.prefix_blocks, grant.tiers
        st.stored_blocks = max(st.stored_blocks, n)
        if not self.load_async:
            # the step that loads must compute at least one token: never the whole prompt
            n = min(n, (request.num_tokens - 1) // self._bs)
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
        grant, pins = st.grant, st.grant_pins
        st.grant, st.grant_pins = None, _Pins()
        if num_external_tokens <= 0:
            pins.release(self._link)
            return
        end = st.hit_blocks
        start = end - (num_external_tokens + self._bs - 1) // self._bs
        block_ids = blocks.get_block_ids()[0]
        hashes = [bytes(h) for h in request.block_hashes[start:end]]
        extents = None if grant is None or not grant.instance else grant.extents[start:end]
        # The grant's pins on blocks vLLM already has go with the load's: released now, they
        # would wake the store during this step's forward pass for nothing.
        self._loads.append(BlockTransfer(
            request.request_id, list(block_ids[start:end]), hashes, notify=self.load_async,
            extents=extents, instance=grant.instance if grant is not None and extents else "",
            granted_at=st.granted_at, granted_ns=self._link.namespace,
            gens=None if grant is None or not extents or not grant.gens
            else grant.gens[start:end],
        ))
        pins.plain = [h for i, h in enumerate(hashes) if extents is None or extents[i] is None]
        self._link.pin(pins.plain)
        st.load_pins = pins
        if not self.load_async:
            self._sync_now.append(pins)
        self.stats.add("hit_tokens", num_external_tokens)

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
            for pins in self._sync_steps.popleft():
                pins.release(self._link)
        if not self._save:
            return meta
        seen: set[bytes] = set()  # two requests sharing a prefix save it once
        for new in so.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is not None:
                st.block_ids = list(new.block_ids[0])
                self._plan_save(st, new.num_computed_tokens, so, meta, seen)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                # A resumed request was preempted: its pages are all new.
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            self._plan_save(st, cached.num_computed_tokens[i], so, meta, seen)
        return meta

    def _plan_save(
        self,
        st: _Req,
        num_computed: int,
        so: SchedulerOutput,
        meta: KVStoreConnectorMetadata,
        seen: set[bytes],
    ) -> None:
        req_id = st.request.request_id
        # Tokens whose KV exists after this step; speculative tokens may yet be rejected.
        done = num_computed + so.num_scheduled_tokens.get(req_id, 0)
        done -= len(so.scheduled_spec_decode_tokens.get(req_id, ()))
        full = min(done // self._bs, len(st.request.block_hashes), len(st.block_ids))
        if full <= st.stored_blocks:
            return
        ids, hashes = [], []
        for i in range(st.stored_blocks, full):
            h = bytes(st.request.block_hashes[i])
            if h not in seen:
                seen.add(h)
                ids.append(st.block_ids[i])
                hashes.append(h)
        st.stored_blocks = full
        if ids:
            meta.saves.append(BlockTransfer(req_id, ids, hashes))

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """Unpin the blocks of loads the workers finished (or gave up on)."""
        for req_id in output.finished_recving or ():
            st = self._reqs.get(req_id)
            if st is not None:
                st.load_pins.release(self._link)

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """Forget ``request``. Its pages can be freed at once: every save was copied out of
        them in ``wait_for_save`` of the step that computed it, before vLLM calls this."""
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            st.grant_pins.release(self._link)
            st.load_pins.release(self._link)
        return False, None

    def take_stats(self) -> KVStoreConnectorStats | None:
        return self.stats.take()

    def close(self) -> None:
        self._link.close()

    # -- helpers -----------------------------------------------------------------------------

    def _state(self, request: Request) -> _Req:
        st = self._reqs.get(request.request_id)
        if st is None:  # the scheduler may skip on_new_request for resumed streaming inputs
            st = self._reqs[request.request_id] = _Req(request)
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
