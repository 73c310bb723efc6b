"""Continuous batching: batched outputs equal single-request outputs, whatever the chunking,
arrival order or cache pressure."""

from __future__ import annotations

import random
from pathlib import Path

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(97) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


def singles(model: Path, ps: list[list[int]], params: SamplingParams) -> list[list[int]]:
    engine = Engine(model, EngineConfig(block_size=4, num_blocks=64))
    return [engine.generate([p], params)[0] for p in ps]


def test_batched_equals_single_with_chunked_prefill(gqa_model: Path) -> None:
    ps = prompts(6)
    want = singles(gqa_model, ps, GREEDY)
    engine = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=128, max_batch_tokens=16))
    assert engine.generate(ps, GREEDY) == want
    assert engine.steps > len(ps)  # the long prompts really were split into chunks


def test_requests_join_a_running_batch(gqa_model: Path) -> None:
    ps = prompts(5, seed=1)
    want = singles(gqa_model, ps, GREEDY)
    engine = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=128, max_batch_tokens=24))
    seqs = [engine.add_request(ps[0], GREEDY)]
    joined_while_running = False
    for p in ps[1:]:
        engine.step()
        engine.step()
        joined_while_running |= bool(engine.scheduler.running)
        seqs.append(engine.add_request(p, GREEDY))
    while engine.has_work():
        engine.step()
    assert joined_while_running
    assert [s.output for s in seqs] == want


def test_preemption_under_cache_pressure(gqa_model: Path) -> None:
    ps = prompts(6, seed=2)
    want = singles(gqa_model, ps, GREEDY)
    engine = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=24, max_batch_tokens=64))
    assert engine.generate(ps, GREEDY) == want
    assert engine.stats().preemptions > 0
    assert engine.blocks.num_free == 24  # every block came back


def test_local_prefix_cache_reuses_blocks(gqa_model: Path) -> None:
    shared = prompts(1, seed=3)[0] + [1] * 20
    a, b = shared + [5, 6, 7], shared + [8, 9]
    want = singles(gqa_model, [a, b], GREEDY)
    engine = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=64))
    assert engine.generate([a], GREEDY) == [want[0]]
    seq = engine.add_request(b, GREEDY)
    while engine.has_work():
        engine.step()
    assert seq.output == want[1]
    assert seq.local_hit_tokens == len(shared) // 4 * 4


def test_seeded_sampling_is_independent_of_batching(gqa_model: Path) -> None:
    ps = prompts(3, seed=4)
    params = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    want = singles(gqa_model, ps, params)
    engine = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=8))
    assert engine.generate(ps, params) == want
    other = SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=8, ignore_eos=True)
    assert singles(gqa_model, ps, other) != want


def test_eos_and_stop_tokens_end_a_sequence(gqa_model: Path) -> None:
    p = prompts(1, seed=5)[0]
    free_run = singles(gqa_model, [p], GREEDY)[0]
    stop = free_run[3]
    params = SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(stop,))
    engine = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=64))
    seq = engine.add_request(p, params)
    while engine.has_work():
        engine.step()
    assert seq.output == free_run[:free_run.index(stop) + 1]
    assert seq.finish_reason == "stop"
