"""Tiny random Llama checkpoints written by transformers, shared by the engine tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

TINY: dict[str, Any] = dict(
    vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=512, rms_norm_eps=1e-5,
)


def make_checkpoint(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a randomly initialised ``LlamaForCausalLM`` (float32) to ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**TINY, **overrides})
    model = LlamaForCausalLM(cfg).to(torch.float32)
    # random init gives near-uniform logits; widen them so greedy choices are well separated
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("gqa"), num_key_value_heads=2,
                           rope_theta=50000.0)


@pytest.fixture(scope="session")
def mha_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("mha"), seed=1, num_key_value_heads=4)
