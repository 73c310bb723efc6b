"""Configuration of the built-in decoder: the model (read from a Hugging Face ``config.json``)
and the engine (cache geometry, batching limits, device).

Both are frozen; ``ModelConfig.from_dir`` is the only place that reads a checkpoint's JSON so
that every other module sees typed fields and never a raw dict.
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
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3", "factor": 8.0, ...}
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
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope_type {rope_type!r}; known: {', '.join(ROPE_TYPES)}")

    @classmethod
    def from_dict(cls, doc: dict[str, Any], model_id: str = "") -> ModelConfig:
        """Build from a ``config.json`` dict. Accepts both the transformers 4 layout
        (``rope_theta`` + ``rope_scaling``) and the 5 layout (``rope_parameters``)."""
        kind = doc.get("model_type", "llama")
        if kind not in ("llama", "mistral"):
            raise ValueError(f"unsupported model_type {kind!r}; known: llama, mistral")
        if doc.get("sliding_window"):  # not implemented: attention would silently differ
            raise ValueError("checkpoints with a sliding attention window are not supported")
        heads = doc["num_attention_heads"]
        rope = dict(doc.get("rope_parameters") or doc.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", doc.get("rope_theta", 10000.0)))
        if "type" in rope and "rope_type" not in rope:  # transformers 4 spelling
            rope["rope_type"] = rope.pop("type")
        scaling = rope if rope.get("rope_type", "default") != "default" else None
        eos = doc.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=doc["vocab_size"],
            hidden_size=doc["hidden_size"],
            intermediate_size=doc["intermediate_size"],
            num_layers=doc["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=doc.get("num_key_value_heads") or heads,
            head_dim=doc.get("head_dim") or doc["hidden_size"] // heads,
            rms_norm_eps=float(doc.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=doc.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
            attention_bias=bool(doc.get("attention_bias", False)),
            mlp_bias=bool(doc.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
            dtype=str(doc.get("dtype") or doc.get("torch_dtype") or "float32"),
            model_id=model_id,
        )

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
