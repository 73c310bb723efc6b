"""Tiny random Llama checkpoints and their tokenizer, shared by the engine tests: written by
:mod:`engines.tiny_model`, the code behind ``kvstore-engine make-model``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engines.tiny_model import WIDE_LOGITS, llama_config, words, write_checkpoint, write_tokenizer

TINY: dict[str, Any] = dict(layers=2, hidden=64, heads=4, intermediate=96, vocab=97,
                            rms_norm_eps=1e-5, max_position_embeddings=512)
WORDS = words(TINY["vocab"])  # token i is WORDS[i]; BOS 1, EOS 2


def make_checkpoint(path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a random float32 Llama of the :data:`TINY` sizes (``overrides``: other
    ``LlamaConfig`` fields) to ``path``, with wide logits (see ``WIDE_LOGITS``)."""
    return write_checkpoint(path, llama_config(**{**TINY, **overrides}), seed=seed,
                            logit_scale=WIDE_LOGITS)


def make_tokenizer(path: Path) -> Path:
    """Save the word-level tokenizer over :data:`WORDS`, with its chat template, to ``path``."""
    return write_tokenizer(path, TINY["vocab"])


@pytest.fixture(scope="session")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("gqa"), kv_heads=2, rope_theta=50000.0)


@pytest.fixture(scope="session")
def mha_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("mha"), seed=1, kv_heads=4)
