"""A Llama-family decoder in one file: RMSNorm, RoPE (default, linear, llama3 scaling), grouped-
query attention over a paged KV cache, SwiGLU MLP.

Module names mirror Hugging Face's ``LlamaForCausalLM`` so that a checkpoint's safetensors load
with ``load_state_dict`` and no renaming table. One forward call runs a *flat* batch: the tokens
of every scheduled sequence concatenated (prefill chunks and single decode tokens mixed), as in
nano-vllm; :class:`AttnBatch` says where each token sits and which cache slots it writes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.decoder.config import ModelConfig


class AttnBatch(NamedTuple):
    """Where the ``T`` tokens of one step sit. Built by the runner; all tensors on the model's
    device. ``B`` sequences, query windows padded to ``max_q`` and contexts to the widest block
    table."""

    positions: Tensor  # [T] int64: absolute position of each token
    slots: Tensor  # [T] int64: block_id * block_size + offset where its K/V is written
    seq_index: Tensor  # [T] int64: which of the B sequences the token belongs to
    q_index: Tensor  # [T] int64: index of the token inside its sequence's query window
    block_tables: Tensor  # [B, max_blocks] int64: physical blocks of each sequence, 0-padded
    query_pos: Tensor  # [B, max_q] int64: position of each padded query row (0 for padding)
    logits_index: Tensor  # [S] int64: tokens whose next-token logits are wanted


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """Inverse frequencies of the rotary embedding, with the checkpoint's scaling applied
    (same formulas as transformers' ``modeling_rope_utils``)."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv
    factor = scaling.factor
    if scaling.rope_type == "linear":
        return inv / factor
    if scaling.rope_type == "llama3":
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        old_len = float(scaling.original_max_position_embeddings)
        wavelen = 2 * math.pi / inv
        # long wavelengths are interpolated by `factor`, short ones kept, the band between
        # blended smoothly (Llama 3.1's context extension)
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        return torch.where(medium, blended, scaled)
    return inv


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # normalise in float32 whatever the model dtype, as the reference does
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, b: AttnBatch, kv: Tensor) -> Tensor:
        """``kv`` is this layer's view of the cache, ``[num_blocks, 2, block_size, n_kv, d]``;
        the new tokens' K/V are written into it before attention reads it back, so a chunk
        attends to earlier chunks and to itself through the same path."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(t, self.n_kv, self.head_dim)
        q = q * cos[:, None] + rotate_half(q) * sin[:, None]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]

        k_cache, v_cache = kv[:, 0], kv[:, 1]  # [num_blocks, block_size, n_kv, d] views
        block_size = k_cache.shape[1]
        blk, off = b.slots // block_size, b.slots % block_size
        k_cache[blk, off] = k.to(k_cache.dtype)
        v_cache[blk, off] = v.to(v_cache.dtype)

        n_seq, max_q = b.query_pos.shape
        keys = k_cache[b.block_tables].flatten(1, 2).transpose(1, 2)  # [B, n_kv, S, d]
        values = v_cache[b.block_tables].flatten(1, 2).transpose(1, 2)
        qp = q.new_zeros(n_seq, max_q, self.n_heads, self.head_dim)
        qp[b.seq_index, b.q_index] = q
        # causal over absolute positions: row i sees keys 0..query_pos[i]; padding rows have
        # position 0 so they see one key (never a fully masked row, which would give NaN)
        key_pos = torch.arange(keys.shape[2], device=x.device)
        mask = key_pos[None, None, :] <= b.query_pos[:, :, None]
        out = F.scaled_dot_product_attention(  # query head h reads KV head h // groups
            qp.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype), attn_mask=mask[:, None],
            enable_gqa=self.n_heads != self.n_kv,
        )
        out = out.transpose(1, 2)[b.seq_index, b.q_index]  # back to [T, H, d]
        return self.o_proj(out.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, b: AttnBatch, kv: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, b, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The decoder. ``forward(tokens, batch, cache)`` returns logits ``[S, vocab]`` (float32)
    for the tokens ``batch.logits_index`` selects, after writing every token's K/V into
    ``cache`` (``[num_blocks, num_layers, 2, block_size, n_kv, d]``, see ``paged_kv``)."""

    inv_freq: Tensor  # float32 rotary frequencies, a non-persistent buffer

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    @torch.inference_mode()
    def forward(self, tokens: Tensor, b: AttnBatch, cache: Tensor) -> Tensor:
        x = self.model.embed_tokens(tokens)
        # angles in float32 regardless of model dtype; precision of long positions depends on it
        angles = b.positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, b, cache[:, i])
        x = self.model.norm(x[b.logits_index])
        return self.lm_head(x).float()

    @classmethod
    def from_pretrained(
        cls, path: str | Path, device: str = "cpu", dtype: torch.dtype | None = None
    ) -> LlamaForCausalLM:
        """Load ``config.json`` and every ``*.safetensors`` file of a local checkpoint folder.
        ``dtype`` None keeps the checkpoint's dtype. Raises ``FileNotFoundError`` without
        weights and ``RuntimeError`` when tensors are missing or unexpected."""
        from safetensors.torch import load_file

        path = Path(path)
        cfg = ModelConfig.from_dir(path)
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {path}")
        state: dict[str, Tensor] = {}
        for f in files:
            state.update(load_file(str(f), device="cpu"))
        target = dtype or next(iter(state.values())).dtype
        with torch.device("meta"):
            model = cls(cfg)
        if cfg.tie_word_embeddings:  # one tensor under both names, re-tied after loading
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model.load_state_dict(state, strict=True, assign=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.inv_freq = rope_inv_freq(cfg)  # replaces the meta buffer before the move
        model = model.to(device=device, dtype=target).eval()
        model.inv_freq = rope_inv_freq(cfg).to(device)  # stays float32 whatever the dtype
        return model
