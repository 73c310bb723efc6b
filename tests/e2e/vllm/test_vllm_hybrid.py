"""End to end, the KV layouts beyond one plain attention group: hybrid sliding-window models
(Gemma 3-shaped: three sliding-window layers and one full-attention layer; GPT-OSS-shaped: one
group of each) with vLLM's hybrid KV cache manager on, and MLA (DeepSeek-V3-shaped, the CPU_MLA
backend). For each model, on one kvstore server:

1. a baseline engine (no connector, no prefix caching) computes the greedy tokens of every
   prompt used below;
2. engine A (connector) serves the prompts to be stored, and exits;
3. one block of prompt ``E`` is corrupted on kvstore's disk;
4. engine B, a fresh process, asks for whole, partial and unknown prefixes and for ``E``:
   it gets the hits the stored blocks allow and exactly the baseline's tokens (``E`` is
   recomputed).

The three models share the server and the prompts (the same token ids, so the same block
hashes): each model's namespaces must keep its blocks from the others' engines.

Sliding-window segments store only the windows a later hit can use: before every
``window_stride`` (2) windows and before each prompt's end (``connectors/vllm/segments.py``).
With 32-token blocks and a 64-token window a hit needs the 2 blocks before its end, and the
kept windows end at multiples of 4 blocks and at prompt ends.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvstore.keys import block_hashes

# Each model starts three engines (tens of seconds each on two busy cores).
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(1500)]

_rng = random.Random(11)
CPU_FLAGS = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""


def _tokens(n: int) -> list[int]:
    return [_rng.randrange(1, 500) for _ in range(n)]


P1 = _tokens(300)
P2 = _tokens(170)
E = _tokens(200)  # one of its stored blocks is corrupted before engine B asks for it
SUF = _tokens(40)
STORED = [P1, P2, E]
ASKED = [
    P1 + SUF,  # a whole stored prompt, then new tokens
    P1[:200] + SUF,  # a part of a stored prompt (6 of its 9 blocks)
    P2,  # a stored prompt sent again
    SUF + P2,  # no stored prefix
    E + SUF,  # a stored prompt whose stored block is corrupt
]

GEMMA3 = """
from transformers import Gemma3TextConfig as C, Gemma3ForCausalLM as M
cfg = C(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
    sliding_window=64, layer_types=["sliding_attention"] * 3 + ["full_attention"],
    initializer_range=0.2, tie_word_embeddings=False)
"""
GPT_OSS = """
from transformers import GptOssConfig as C, GptOssForCausalLM as M
cfg = C(vocab_size=512, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
    num_experts_per_tok=2, sliding_window=64, layer_types=["sliding_attention", "full_attention"],
    max_position_embeddings=4096, initializer_range=0.2, tie_word_embeddings=False)
"""
# The CPU MLA kernel takes head size 576 only: kv_lora_rank 512 + qk_rope_head_dim 64. Dense
# layers only: the point is the latent cache, not expert routing.
DEEPSEEK_V3 = """
from transformers import DeepseekV3Config as C, DeepseekV3ForCausalLM as M
cfg = C(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
    num_hidden_layers=2, first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2,
    n_shared_experts=1, n_group=1, topk_group=1, num_attention_heads=4, num_key_value_heads=4,
    kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
    max_position_embeddings=4096, initializer_range=0.2, tie_word_embeddings=False)
"""
SAVE = """
import json, torch
torch.manual_seed(0)
M(cfg).save_pretrained(OUT)
if cfg.model_type == "deepseek_v3":  # what vLLM's DeepSeek loader expects of a V3 config
    path = OUT + "/config.json"
    doc = json.load(open(path))
    doc.update(topk_method="noaux_tc", scoring_func="sigmoid")
    json.dump(doc, open(path, "w"))
"""

# model -> (checkpoint code, extra engine arguments, block size, kinds of its namespaces,
# tokens engine B should load for each prompt of ASKED but E, whether prompts go one by one)
MODELS: dict[str, tuple[str, dict[str, Any], int, list[str], list[int], bool]] = {
    # P1 + SUF: P1's 9 blocks (its prompt end keeps the window before block 9); P1[:200]:
    # 6 blocks match, the window before 6 was not kept, the one before 4 was; P2: its 5
    # blocks (the last one holds the last token, computed again)
    "gemma3": (GEMMA3, {"disable_hybrid_kv_cache_manager": False}, 32, ["full", "sliding"],
               [288, 128, 160, 0], False),
    "gpt-oss": (GPT_OSS, {"disable_hybrid_kv_cache_manager": False}, 32, ["full", "sliding"],
                [288, 128, 160, 0], False),
    # One full-attention group of latents, 16-token blocks: every stored block is usable
    # where the engine can resume a prompt from stored latents (GPUs, AMX CPUs). vLLM 0.32's
    # reference CPU MLA backend cannot (it turns vLLM's own prefix cache off): there the
    # connector only stores, and engine B computes everything. That backend also gives a
    # prompt other tokens when other prompts share its batch (without any connector;
    # measured), so every engine gets one prompt at a time.
    "deepseek-v3-mla": (DEEPSEEK_V3, {}, 16, ["mla"],
                        [304, 192, 160, 0] if "amx_tile" in CPU_FLAGS else [0, 0, 0, 0], True),
}


@pytest.fixture(scope="module", params=list(MODELS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    name = request.param
    out = tmp_path_factory.mktemp(name)
    code = MODELS[name][0] + f"OUT = {str(out)!r}\n" + SAVE
    subprocess.run([os.sys.executable, "-c", code], check=True, timeout=300)
    return str(out)


def _namespaces(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/v1/namespaces", timeout=10) as resp:
        return list(json.load(resp)["namespaces"])


def _stored_blocks(url: str, name: str) -> int:
    with urllib.request.urlopen(f"{url}/v1/namespaces/{name}", timeout=10) as resp:
        return int(json.load(resp)["stats"]["blocks"])


def test_hybrid_and_mla_models_load_stored_prefixes_and_match_baseline(
    model: str, request: pytest.FixtureRequest, kvstore_server: Any, engine: Any,
    make_spec: Any, corrupt_block: Any,
) -> None:
    name = request.node.callspec.params["model"]
    _, engine_args, block, kinds, expected, alone = MODELS[name]

    def spec(url: str | None, **extra: Any) -> dict[str, Any]:
        s: dict[str, Any] = make_spec(model, "float32", url, **extra)
        s.update(block_size=block, max_model_len=1024, engine_args=engine_args)
        return s

    def run(proc: Any, prompts: list[list[int]]) -> dict[str, Any]:
        return dict(proc.generate_each(prompts) if alone else proc.generate(prompts))

    every = STORED + ASKED
    base = engine(spec(None))
    baseline = run(base, every)["tokens"]
    base.close()

    before = {ns["name"] for ns in _namespaces(kvstore_server.url)}
    a = engine(spec(kvstore_server.url))
    out_a = run(a, STORED)
    a.close()
    assert out_a["tokens"] == baseline[: len(STORED)]
    mine = [ns for ns in _namespaces(kvstore_server.url) if ns["name"] not in before]
    assert sorted(ns["layout"]["extra"].get("kind", "full") for ns in mine) == kinds
    if "sliding" in kinds:
        # only the windows later hits can use were stored
        assert out_a["metrics"]["vllm:kvstore_window_skipped_bytes"] > 0

    # the saves reached the store (not the engine's saved_blocks counter: the save thread's
    # counts reach vLLM at its next step, and on a loaded machine the last saves end after
    # the last step, leaving the counter at 0 though the engine's close stored them)
    assert all(_stored_blocks(kvstore_server.url, ns["name"]) > 0 for ns in mine)
    loads = any(expected)
    if loads:  # corrupt E's second block in the namespace every hit needs whole
        (whole,) = [ns["name"] for ns in mine if ns["layout"]["extra"].get("kind") != "sliding"]
        h = block_hashes(E, block, seed=os.environ.get("PYTHONHASHSEED"))[1]
        corrupt_block(kvstore_server, whole, h)

    # prefetch off: a prefetch would read (and drop) the corrupt block before the lookup
    b = engine(spec(kvstore_server.url, prefetch=False))
    result = run(b, ASKED)
    assert result["tokens"] == baseline[len(STORED):]
    assert result["cached"][:4] == expected
    metrics = result["metrics"]
    if loads:
        assert metrics["vllm:kvstore_load_errors"] >= 1
        assert metrics["vllm:kvstore_hit_tokens"] >= sum(expected)
    else:
        assert metrics["vllm:kvstore_hit_tokens"] == 0
        assert any("loads are off for this engine" in line for line in b.lines)
    b.close()
