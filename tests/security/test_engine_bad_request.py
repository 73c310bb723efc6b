"""One bad request fails only itself: sampling parameters the sampler cannot use are made
usable (a tiny temperature is greedy, a tiny top_p keeps the top token, as vLLM does) or
refused with a 400 by the worker; an exception inside an engine step fails only the request it
belongs to, and the step goes on for the others; the router keeps every worker up and passes
a worker's 4xx to the client without trying another worker. Real tiny model, real worker and
router processes on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from engines.decoder.config import EngineConfig
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams, make_generator, sample
from engines.decoder.scheduler import Sequence
from engines.testing import Proc, engine_proc, router_proc
from engines.tiny_model import WIDE_LOGITS, llama_config, write_checkpoint

VOCAB = 97
ECFG = EngineConfig(block_size=4, num_blocks=128, max_batch_tokens=64)
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)
PROMPTS = [[3 + i, 11, 12, 13, 14, 15 + i] for i in range(8)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=VOCAB,
                          max_position_embeddings=512)
    return write_checkpoint(tmp_path_factory.mktemp("model"), config, seed=0,
                            logit_scale=WIDE_LOGITS)


def _forced(params: SamplingParams, **fields: object) -> SamplingParams:
    """``params`` with fields its validation would refuse: what a bug or a path around the
    validation would hand the sampler, deep inside a step."""
    for name, value in fields.items():
        object.__setattr__(params, name, value)
    return params


def test_tiny_temperature_is_greedy_and_tiny_top_p_keeps_the_top_token() -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1)) * 8
    best = int(torch.argmax(logits))
    tiny_t = SamplingParams(temperature=1e-40)
    assert tiny_t.temperature == 0.0  # greedy, as vLLM treats temperature < 1e-5
    assert sample(logits, tiny_t, make_generator(tiny_t)) == best
    assert SamplingParams(temperature=1e-3).temperature == 1e-2  # raised, as vLLM does
    tiny_p = SamplingParams(temperature=1.0, top_p=1e-300, seed=3)  # float32 rounds it to 0
    assert sample(logits, tiny_p, make_generator(tiny_p)) == best
    for bad in ({"temperature": float("nan")}, {"temperature": float("inf")},
                {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": float("nan")},
                {"seed": 2**64}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)  # type: ignore[arg-type]


def _solo(model: Path, prompt: list[int]) -> list[int]:
    return Engine(model, ECFG).generate([prompt], GREEDY)[0]


def test_a_sampling_failure_fails_only_its_request(model: Path) -> None:
    engine = Engine(model, ECFG)
    good = [engine.add_request(p, GREEDY) for p in PROMPTS[:3]]
    bad = engine.add_request(PROMPTS[3], SamplingParams(max_tokens=6, temperature=1.0, seed=1))
    _forced(bad.params, temperature=float("nan"))  # its logits / NaN: no distribution
    while engine.has_work():
        engine.step()  # never raises: the failure is the bad request's alone
    assert bad.finish_reason == "error" and bad.error and "sampling" in bad.error
    assert [s.output for s in good] == [_solo(model, p) for p in PROMPTS[:3]]
    assert engine.blocks.num_free == ECFG.num_blocks  # the failed request's blocks came back


def test_a_forward_failure_fails_only_its_request(model: Path) -> None:
    engine = Engine(model, ECFG)
    good = [engine.add_request(p, GREEDY) for p in PROMPTS[:3]]
    # a token the embedding has no row for, past add_request's check: the batched forward
    # pass raises, and only this request may fail for it
    bad = Sequence("bad", [5, 6, VOCAB + 1000], 3, GREEDY)
    engine.scheduler.add(bad)
    while engine.has_work():
        engine.step()
    assert bad.finish_reason == "error" and bad.error
    assert [s.output for s in good] == [_solo(model, p) for p in PROMPTS[:3]]
    assert engine.blocks.num_free == ECFG.num_blocks


@pytest.fixture(scope="module")
def fleet(model: Path) -> Iterator[tuple[list[Proc], Proc]]:
    workers = [engine_proc(model, args=("--block-size", "4", "--num-blocks", "256")).start()
               for _ in range(2)]
    router = router_proc([w.url for w in workers], policy="round-robin").start()
    try:
        yield workers, router
    finally:
        for p in (router, *workers):
            p.stop()


def _ready(workers: list[Proc], router: Proc) -> None:
    health = httpx.get(f"{router.url}/health", timeout=30).json()
    assert health["ready"] and health["workers_up"] == len(workers), health
    workers_view = httpx.get(f"{router.url}/stats", timeout=30).json()["workers"]
    assert all(w["up"] for w in workers_view.values()), workers_view


def test_bad_sampling_through_the_router_fails_nothing_else(
        fleet: tuple[list[Proc], Proc], model: Path) -> None:
    workers, router = fleet
    want = [_solo(model, p) for p in PROMPTS]
    body = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}

    async def run() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(timeout=300) as client:
            def post(extra: dict[str, object]) -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(client.post(f"{router.url}/v1/completions",
                                                       json={**body, **extra}))

            good = [post({"prompt": p}) for p in PROMPTS]
            bad = [post({"prompt": [5], "max_tokens": 1, "temperature": 1e-40}),
                   post({"prompt": [5], "max_tokens": 1, "temperature": 1.0, "top_p": 1e-300})]
            return list(await asyncio.gather(*good)), list(await asyncio.gather(*bad))

    good, bad = asyncio.run(run())
    assert [r.status_code for r in good] == [200] * len(PROMPTS), [r.text for r in good]
    assert [r.json()["choices"][0]["token_ids"] for r in good] == want
    # the values the sampler could not use are served as vLLM serves them: the top token
    assert [r.status_code for r in bad] == [200, 200], [r.text for r in bad]
    top = _solo(model, [5])[0]
    assert [r.json()["choices"][0]["token_ids"] for r in bad] == [[top], [top]]
    _ready(workers, router)


def test_a_request_the_worker_refuses_is_a_400_tried_once(
        fleet: tuple[list[Proc], Proc]) -> None:
    workers, router = fleet

    def requests() -> int:
        return sum(httpx.get(f"{w.url}/stats", timeout=30).json()["requests"] for w in workers)

    before = requests()
    r = httpx.post(f"{router.url}/v1/completions", timeout=120,
                   json={"prompt": [5, VOCAB + 7], "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert "token ids" in r.json()["error"]["message"]
    assert requests() == before + 1  # one worker refused it; no other was asked
    _ready(workers, router)
    # the worker's own validation: a 400 with the field named, not a 422 or a 500
    # (NaN and Infinity as Python's json reads and writes them)
    for field, value in (("temperature", "NaN"), ("temperature", "Infinity"), ("top_p", "0"),
                         ("temperature", "-1")):
        r = httpx.post(f"{workers[0].url}/generate", timeout=60,
                       headers={"content-type": "application/json"},
                       content=f'{{"prompt_ids": [5], "max_tokens": 1, "{field}": {value}}}')
        assert r.status_code == 400, r.text
        assert field in r.json()["detail"]
    _ready(workers, router)
