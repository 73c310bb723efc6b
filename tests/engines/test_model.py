"""The decoder matches transformers' LlamaForCausalLM on the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.decoder.config import EngineConfig, ModelConfig, RopeScaling
from engines.decoder.model import rope_inv_freq
from engines.decoder.runner import Engine
from engines.decoder.sampler import SamplingParams
from tests.engines.conftest import make_checkpoint

PROMPT = [5, 17, 33, 2, 9, 61, 44, 12, 80, 3, 7, 19, 23, 40, 55, 66, 71, 8, 90, 14, 27]


def reference(path: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def check_against_reference(path: Path, block_size: int, max_batch_tokens: int,
                            device: str = "cpu", atol: float = 1e-4) -> None:
    """Prefill and every decode step: logits within ``atol``; greedy tokens identical to HF
    (both on ``device``)."""
    engine = Engine(path, EngineConfig(block_size=block_size, num_blocks=64,
                                       max_batch_tokens=max_batch_tokens, device=device))
    seq = engine.add_request(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))
    ours = []
    while engine.has_work():
        if engine.step():
            ours.append(engine.last_logits[0])
    ref = reference(path).to(device)
    full = torch.tensor([seq.tokens], device=device)
    with torch.no_grad():
        ref_logits = ref(full).logits[0].cpu()
    assert len(ours) == 12
    for i, row in enumerate(ours):
        torch.testing.assert_close(row.cpu(), ref_logits[len(PROMPT) - 1 + i], atol=atol,
                                   rtol=0)
    with torch.no_grad():
        hf = ref.generate(torch.tensor([PROMPT], device=device), max_new_tokens=12,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    assert seq.output == hf[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("block_size,chunk", [(4, 512), (16, 512), (4, 6)])
def test_gqa_matches_transformers(gqa_model: Path, block_size: int, chunk: int) -> None:
    check_against_reference(gqa_model, block_size, chunk)


def test_mha_matches_transformers(mha_model: Path) -> None:
    check_against_reference(mha_model, 8, 512)


def test_llama3_rope_and_tied_embeddings(tmp_path: Path) -> None:
    path = make_checkpoint(
        tmp_path, seed=3, kv_heads=1, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    )
    check_against_reference(path, 4, 7)


def test_rope_inv_freq_matches_transformers(tmp_path: Path) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for scaling in ({"rope_type": "linear", "factor": 4.0},
                    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32}):
        hf = LlamaConfig(hidden_size=64, num_attention_heads=2, rope_theta=20000.0,
                         rope_scaling=dict(scaling))
        want, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf, "cpu")
        ours = rope_inv_freq(ModelConfig.from_dict(hf.to_dict()))
        torch.testing.assert_close(ours, want)


def test_unsupported_rope_type_is_refused() -> None:
    doc = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
               num_attention_heads=2, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_dict(doc)


def test_a_config_missing_what_the_decoder_needs_is_refused_by_name() -> None:
    doc = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_attention_heads=2)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelConfig.from_dict(doc)
    doc.update(num_hidden_layers=1, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(ValueError, match="low_freq_factor"):
        ModelConfig.from_dict(doc)
    # the transformers 4 spelling ``type``, and transformers 5's ``rope_parameters``
    doc.update(rope_scaling={"type": "linear", "factor": 2.0})
    assert ModelConfig.from_dict(doc).rope_scaling == RopeScaling("linear", 2.0)
    doc.update(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    cfg = ModelConfig.from_dict(doc)
    assert (cfg.rope_scaling, cfg.rope_theta) == (None, 500000.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(gqa_model: Path) -> None:
    """The same code on CUDA: greedy tokens equal the CPU engine's, and blocks round-trip
    through the CUDA gather/scatter path."""
    from engines.decoder import kernels

    params = SamplingParams(max_tokens=12, ignore_eos=True)
    cpu = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=64))
    gpu = Engine(gqa_model, EngineConfig(block_size=4, num_blocks=64, device="cuda"))
    assert gpu.generate([PROMPT], params) == cpu.generate([PROMPT], params)
    data = [bytes(b) for b in kernels.gather_blocks(gpu.cache, [0, 1])]
    kernels.scatter_blocks(gpu.cache, [5, 6], data)
    assert torch.equal(gpu.cache[5], gpu.cache[0]) and torch.equal(gpu.cache[6], gpu.cache[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block_size,chunk", [(4, 512), (16, 6)])
def test_cuda_matches_transformers(gqa_model: Path, block_size: int, chunk: int) -> None:
    """On CUDA against transformers on CUDA: logits close (another summation order than the
    CPU's, hence the looser bound) and the greedy tokens identical."""
    check_against_reference(gqa_model, block_size, chunk, device="cuda", atol=1e-3)
