"""Which blocks a step's forward pass completes, and which of them each segment saves.

A full-attention segment saves every new block. A sliding-window segment saves only the
windows a later hit can start from (:meth:`~connectors.vllm.segments.Segment.keeps`): every
few window boundaries, the prompt's end, and a branch point where another prompt with this
prefix went on differently. Two requests sharing a prefix in one step save it once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from connectors.vllm.metadata import BlockTransfer, KVStoreConnectorMetadata

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vllm.v1.core.sched.output import SchedulerOutput

    from connectors.vllm.req_state import ReqState
    from connectors.vllm.seg_links import SegLink
    from connectors.vllm.stats import KVStoreConnectorStats


class SavePlan:
    """Turns a scheduler output into the step's saves; owns no request state (the scheduler
    half passes each request's :class:`~connectors.vllm.req_state.ReqState`)."""

    def __init__(self, segs: Sequence[SegLink], block_size: int,
                 stats: KVStoreConnectorStats) -> None:
        self._segs = segs
        self._bs = block_size
        self._stats = stats

    def step(self, so: SchedulerOutput, reqs: dict[str, ReqState],
             meta: KVStoreConnectorMetadata) -> None:
        """Add to ``meta`` the saves of every request ``so`` schedules, tracking their pages."""
        seen: set[tuple[int, bytes]] = set()  # two requests sharing a prefix save it once
        for new in so.scheduled_new_reqs:
            st = reqs.get(new.req_id)
            if st is not None:
                st.block_ids = [list(g) for g in new.block_ids]
                self._request(st, new.num_computed_tokens, so, meta, seen)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = reqs.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                # A resumed request was preempted: its pages are all new.
                st.block_ids = [list(g) for g in new_ids] if new_ids else []
            elif new_ids:
                if not st.block_ids:
                    st.block_ids = [[] for _ in new_ids]
                for mine, more in zip(st.block_ids, new_ids, strict=True):
                    mine.extend(more)
            self._request(st, cached.num_computed_tokens[i], so, meta, seen)

    def _request(
        self,
        st: ReqState,
        num_computed: int,
        so: SchedulerOutput,
        meta: KVStoreConnectorMetadata,
        seen: set[tuple[int, bytes]],
    ) -> None:
        req_id = st.request.request_id
        # Tokens whose KV exists after this step; speculative tokens may yet be rejected.
        done = num_computed + so.num_scheduled_tokens.get(req_id, 0)
        done -= len(so.scheduled_spec_decode_tokens.get(req_id, ()))
        groups = st.block_ids
        full = min(done // self._bs, len(st.request.block_hashes),
                   *(len(g) for g in groups)) if groups else 0
        if not st.saved:
            st.saved = [0] * len(self._segs)
        if full <= min(st.saved):
            return
        # where the prompt ends (a later turn, or the prompt sent again, hits there) and where
        # another prompt branched off this one's prefix
        prompt = st.request.num_prompt_tokens
        ends = (prompt // self._bs, (prompt - 1) // self._bs, st.branch)
        # blocks new to the store: a store of every layer would save them in every segment
        new = max((st.saved[i] for i, seg in enumerate(self._segs) if not seg.window), default=0)
        for i, seg in enumerate(self._segs):
            ids = [groups[g] for g in seg.groups]
            where, hashes = [], []
            for b in range(st.saved[i], full):
                h = bytes(st.request.block_hashes[b])
                if (i, h) in seen or not all(g[b] for g in ids):
                    continue
                if not seg.keeps(b, ends):
                    if b >= new:
                        self._stats.add("window_skipped_bytes", seg.block_bytes)
                    continue
                seen.add((i, h))
                where.append(b)
                hashes.append(h)
            if where:
                meta.saves.append(BlockTransfer(
                    req_id, [ids[0][b] for b in where], hashes, segment=i,
                    extra_ids=[[g[b] for b in where] for g in ids[1:]],
                ))
            st.saved[i] = max(st.saved[i], full)
