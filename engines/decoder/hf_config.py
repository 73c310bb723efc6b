"""A checkpoint's Hugging Face ``config.json``, parsed once into typed fields: the fields the
decoder reads, with transformers' defaults, in either the transformers 4 layout
(``rope_theta`` + ``rope_scaling``) or the 5 layout (``rope_parameters``); other fields are
ignored. :meth:`HFConfig.decoder_config` turns it into the decoder's
:class:`~engines.decoder.config.ModelConfig`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from engines.decoder.config import ModelConfig, RopeScaling


class HFRope(BaseModel):
    """``rope_scaling`` (transformers 4, ``type`` the older spelling of ``rope_type``) or
    ``rope_parameters`` (transformers 5, with ``rope_theta`` inside)."""

    model_config = ConfigDict(extra="ignore")

    rope_type: str | None = None
    type: str | None = None
    rope_theta: float | None = None
    factor: float = 0.0
    low_freq_factor: float = 0.0
    high_freq_factor: float = 0.0
    original_max_position_embeddings: int = 0


class HFConfig(BaseModel):
    """The fields of a Llama-family ``config.json`` the decoder reads."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    model_type: str = "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: HFRope | None = None
    rope_parameters: HFRope | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    eos_token_id: int | list[int] | None = None
    dtype: str | None = None
    torch_dtype: str | None = None

    @field_validator("rope_scaling", "rope_parameters", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return value or None  # {}: no scaling, as an absent field

    def decoder_config(self, model_id: str = "") -> ModelConfig:
        """The decoder's view of this checkpoint (``ValueError`` for one it cannot run)."""
        if self.model_type not in ("llama", "mistral"):
            raise ValueError(f"unsupported model_type {self.model_type!r}; known: llama, mistral")
        if self.sliding_window:  # not implemented: attention would silently differ
            raise ValueError("checkpoints with a sliding attention window are not supported")
        rope = self.rope_parameters or self.rope_scaling or HFRope()
        kind = rope.rope_type or rope.type or "default"
        scaling = None if kind == "default" else RopeScaling(
            kind, rope.factor, rope.low_freq_factor, rope.high_freq_factor,
            rope.original_max_position_embeddings)
        heads = self.num_attention_heads
        eos = self.eos_token_id
        return ModelConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=self.num_key_value_heads or heads,
            head_dim=self.head_dim or self.hidden_size // heads,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta if rope.rope_theta is None else rope.rope_theta,
            rope_scaling=scaling,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            attention_bias=self.attention_bias,
            mlp_bias=self.mlp_bias,
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            dtype=self.dtype or self.torch_dtype or "float32",
            model_id=model_id,
        )
