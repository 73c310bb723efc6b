"""Configuration of the built-in decoder: the model (read from a Hugging Face ``config.json``)
and the engine (cache geometry, batching limits, device).

Both are frozen; ``ModelConfig.from_dir`` is the only place that reads a checkpoint's JSON
(parsed once by :mod:`engines.decoder.hf_config`) so that every other module sees typed fields
and never a raw dict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a dtype is made, so that --help stays quick
    import torch

ROPE_TYPES = ("default", "linear", "llama3")  # rope scalings the decoder implements exactly

DEFAULT_BLOCK_SIZE = 16  # tokens per KV block (vLLM's default)
DEFAULT_NUM_BLOCKS = 512  # blocks in the paged cache
DEFAULT_MAX_BATCH_TOKENS = 512  # tokens per forward step; longer prompts prefill in chunks
DEFAULT_MAX_SEQS = 32  # sequences in one running batch

DTYPES = ("float32", "float16", "bfloat16")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or a ``torch.dtype``) to ``torch.dtype``."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
    dtype: torch.dtype = getattr(torch, name)
    return dtype


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """How the rotary embedding is scaled past the trained context: ``linear`` divides every
    frequency by ``factor``; ``llama3`` (Llama 3.1) divides the low ones and blends a band
    between ``low_freq_factor`` and ``high_freq_factor`` wavelengths of the
    ``original_max_position_embeddings`` (0: not given)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 0.0
    high_freq_factor: float = 0.0
    original_max_position_embeddings: int = 0

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES or self.rope_type == "default":
            raise ValueError(f"unsupported rope_type {self.rope_type!r}; known: "
                             f"{', '.join(ROPE_TYPES)}")
        if self.factor <= 0:
            raise ValueError(f"{self.rope_type} rope scaling needs a positive factor")
        band = (self.low_freq_factor, self.high_freq_factor,
                self.original_max_position_embeddings)
        if self.rope_type == "llama3" and not (0 < band[0] < band[1] and band[2] > 0):
            raise ValueError("llama3 rope scaling needs 0 < low_freq_factor < "
                             "high_freq_factor and original_max_position_embeddings")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The architecture of a Llama-family checkpoint."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None  # None: the default (unscaled) rotary embedding
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"  # the checkpoint's stored dtype
    model_id: str = ""  # folder name; part of the kvstore namespace identity

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )

    @classmethod
    def from_dict(cls, doc: dict[str, Any], model_id: str = "") -> ModelConfig:
        """Build from a ``config.json`` document (:class:`~engines.decoder.hf_config.HFConfig`
        says which fields count); ``ValueError`` for a checkpoint the decoder cannot run."""
        from engines.decoder.hf_config import HFConfig  # pydantic: not for --help

        return HFConfig.model_validate(doc).decoder_config(model_id)

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        return cls.from_dict(json.loads((path / "config.json").read_text()), model_id=path.name)

@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Cache geometry and batching limits of one engine instance."""

    block_size: int = DEFAULT_BLOCK_SIZE
    num_blocks: int = DEFAULT_NUM_BLOCKS
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_seqs: int = DEFAULT_MAX_SEQS
    device: str = "cpu"
    dtype: str | None = None  # None: the checkpoint's dtype (float32 on CPU if it is half)
    namespace: str | None = None  # kvstore namespace; None derives one from the layout
    hash_algo: str = "sha256"  # kvstore/vLLM block-hash recipe
    hash_seed: str | None = None

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_batch_tokens", "max_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda[:N], got {self.device!r}")
