"""Prefix reuse through an in-process kvstore Store: greedy tokens are identical with and
without reuse for full, partial and no prefix hits, and store failures only cost recompute."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from engines.store_io import LocalStore
from kvstore.config import StoreConfig, TierConfig
from kvstore.store import Store

BS = 4
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)
ECFG = EngineConfig(block_size=BS, num_blocks=96, max_batch_tokens=32)


@pytest.fixture
def store(gqa_model: Path) -> Iterator[Store]:
    probe = Engine(gqa_model, ECFG)
    slot = probe.block_bytes
    s = Store(StoreConfig((TierConfig("host", 256 * slot, options={"slot_bytes": slot}),)))
    yield s
    s.close()


def rand(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(97) for _ in range(n)]


def baseline(model: Path, prompt: list[int]) -> list[int]:
    return Engine(model, ECFG).generate([prompt], GREEDY)[0]


def run(engine: Engine, prompt: list[int]) -> tuple[list[int], int]:
    seq = engine.add_request(prompt, GREEDY)
    while engine.has_work():
        engine.step()
    return seq.output, seq.store_hit_tokens


def test_full_partial_and_no_hits(gqa_model: Path, store: Store) -> None:
    shared = rand(26, 0)
    writer = Engine(gqa_model, ECFG, LocalStore(store))
    assert run(writer, shared)[1] == 0
    store.check_integrity()

    reader = Engine(gqa_model, ECFG, LocalStore(store))  # a fresh engine: nothing resident
    out, hit = run(reader, shared)
    assert hit == (len(shared) - 1) // BS * BS  # full hit: all but the last partial block
    assert out == baseline(gqa_model, shared)

    partial = shared[:13] + rand(11, 1)
    out, hit = run(Engine(gqa_model, ECFG, LocalStore(store)), partial)
    assert hit == 12
    assert out == baseline(gqa_model, partial)

    fresh = rand(19, 2)
    out, hit = run(Engine(gqa_model, ECFG, LocalStore(store)), fresh)
    assert hit == 0
    assert out == baseline(gqa_model, fresh)


def test_generated_blocks_are_stored_for_the_next_turn(gqa_model: Path, store: Store) -> None:
    turn1 = rand(10, 3)
    out1, _ = run(Engine(gqa_model, ECFG, LocalStore(store)), turn1)
    turn2 = turn1 + out1 + rand(5, 4)  # the chat history grows by the answer and a new message
    out2, hit = run(Engine(gqa_model, ECFG, LocalStore(store)), turn2)
    # blocks that are full once the answer's last-but-one token is computed are in the store
    assert hit == (len(turn1) + len(out1) - 1) // BS * BS
    assert out2 == baseline(gqa_model, turn2)


class FlakyStore(LocalStore):
    """Holds the blocks but fails or loses them on the read path (fault injection)."""

    def __init__(self, store: Store, mode: str) -> None:
        super().__init__(store)
        self.mode = mode

    def get(self, namespace: str, hashes: Sequence[bytes]) -> list[bytes | None]:
        if self.mode == "raise":
            raise ConnectionError("store down")
        got: list[Any] = super().get(namespace, hashes)
        got[len(got) // 2] = None  # a block evicted between lookup and get
        return got


@pytest.mark.parametrize("mode", ["raise", "evicted"])
def test_store_failures_fall_back_to_recompute(gqa_model: Path, store: Store, mode: str) -> None:
    prompt = rand(30, 5)
    run(Engine(gqa_model, ECFG, LocalStore(store)), prompt)
    engine = Engine(gqa_model, ECFG, FlakyStore(store, mode))
    out, hit = run(engine, prompt)
    assert out == baseline(gqa_model, prompt)
    assert hit == (0 if mode == "raise" else 7 // 2 * BS)
    assert engine.blocks.num_free == ECFG.num_blocks




def test_loads_straight_into_cache_rows(gqa_model: Path, store: Store) -> None:
    prompt = rand(23, 6)
    run(Engine(gqa_model, ECFG, LocalStore(store)), prompt)
    engine = Engine(gqa_model, ECFG, LocalStore(store))  # get_into: into the cache rows
    out, hit = run(engine, prompt)
    assert hit == 20
    assert out == baseline(gqa_model, prompt)
    assert engine.connector is not None and engine.connector.stats.loaded_blocks == 5


class RecordingStore(LocalStore):
    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.batches: list[list[bytes]] = []

    def put(self, namespace: str, hashes: Sequence[bytes], blocks: Sequence[Any]) -> None:
        self.batches.append(list(hashes))
        super().put(namespace, hashes, blocks)


def test_same_prefix_in_one_step_is_saved_once(gqa_model: Path, store: Store) -> None:
    """Two requests with one prompt prefill in the same step; each hash goes out once (the
    shared-memory path of kvstore serve fails a batch that names a hash twice)."""
    prompt = rand(17, 7)
    rec = RecordingStore(store)
    engine = Engine(gqa_model, ECFG, rec)
    outs = engine.generate([prompt, prompt], GREEDY)
    assert outs[0] == outs[1] == baseline(gqa_model, prompt)
    assert rec.batches and all(len(b) == len(set(b)) for b in rec.batches)
