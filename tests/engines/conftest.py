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


WORDS = ["<unk>", "<s>", "</s>", "system", "user", "assistant", ":",
         *(f"w{i}" for i in range(7, TINY["vocab_size"]))]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} "
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def make_tokenizer(path: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """Save a word-level Hugging Face tokenizer over the tiny models' vocabulary to ``path``
    (token ``i`` is ``WORDS[i]``; BOS 1, EOS 2), built locally with ``tokenizers``; its
    ``tokenizer_config.json`` carries ``chat_template``."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(path)
    if chat_template is not None:
        cfg_path = path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg_path.write_text(json.dumps({**cfg, "chat_template": chat_template}, indent=2))
    return path
