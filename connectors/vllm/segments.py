"""The engine's KV cache groups as the store sees them: one segment per kind of attention.

vLLM splits a hybrid model's layers into KV cache groups of equal page size (Gemma 3: one
group per sliding-window layer of each five and one for the full-attention layer; GPT-OSS:
one sliding and one full group), each with its own block table over one shared pool of
pages. Groups of the same kind and window are one *segment* here: a stored block of a
segment is the page of every layer of its groups at one position of the prompt, and each
segment is its own store namespace (its own block size and identity). A plain model is one
``full`` segment, and its namespace is the one it had before segments existed.

What a later hit needs differs by kind, as in vLLM's own hybrid prefix cache: a full-attention
(or MLA) segment needs every block of the prefix; a sliding-window segment needs only the
``window_blocks`` blocks before the hit's boundary. So a sliding segment does not store every
block: only the windows before every ``stride_blocks``-th boundary and before the end of each
prompt (:meth:`Segment.keeps`), which is where later hits land. A hit between two kept
windows is cut back to the last one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from connectors.vllm.layout import KVLayout, dtype_name, packing

WINDOW_STRIDE = 2  # a sliding segment keeps a window before every boundary this many windows apart


@dataclass(frozen=True, slots=True)
class Segment:
    """KV cache groups ``groups`` (vLLM's indices) of one kind; ``layers[i]`` names group
    ``groups[i]``'s layers. ``window_blocks`` is 0 for full attention, else the blocks a hit
    needs before its boundary; ``stride_blocks`` (sliding only; 0 keeps every block) spaces
    the windows a sliding segment keeps."""

    index: int
    layout: KVLayout
    groups: tuple[int, ...]
    layers: tuple[tuple[str, ...], ...]
    window_blocks: int = 0
    stride_blocks: int = 0

    @property
    def sliding(self) -> bool:
        return self.window_blocks > 0

    def layer_groups(self) -> dict[str, int]:
        """Layer name -> the position of its group in :attr:`groups`."""
        return {name: k for k, names in enumerate(self.layers) for name in names}

    def keeps(self, i: int, boundaries: tuple[int, ...] = ()) -> bool:
        """Whether block ``i`` is worth storing: always for full attention; for a sliding
        window when it lies in the window before a multiple of ``stride_blocks`` or before one
        of ``boundaries`` (block counts: the prompt's end, where its next turn will hit)."""
        k, s = self.window_blocks, self.stride_blocks
        if not k or not s:
            return True
        if i % s >= s - k:
            return True
        return any(b - k <= i < b for b in boundaries)


def cannot_resume(vllm_config: Any) -> str | None:
    """Why this engine cannot start a prompt from KV loaded into its pages, or None when it
    can. vLLM 0.32's reference CPU MLA backend (x86 without AMX, or CPU_MLA chosen) prefills
    only whole prompts: vLLM turns its own prefix cache and chunked prefill off for it, and a
    prompt resumed from stored latents decodes wrong tokens (measured)."""
    from vllm.platforms import current_platform

    model = vllm_config.model_config
    if current_platform.is_cpu() and model.use_mla \
            and not vllm_config.cache_config.enable_prefix_caching \
            and not vllm_config.scheduler_config.enable_chunked_prefill:
        return ("vLLM's CPU MLA backend here cannot prefill a prompt from cached latents (vLLM "
                "turned its own prefix cache off for the same reason)")
    return None


def segments_from_vllm(vllm_config: Any, kv_cache_config: Any, tp_rank: int = 0,
                       window_stride: int = WINDOW_STRIDE) -> list[Segment]:
    """The segments of this engine's KV cache on rank ``tp_rank``.

    Raises ``NotImplementedError`` for what the connector cannot move: Mamba and
    linear-attention state groups, chunked local attention, sliding-window MLA, and fp8
    caches whose scales are computed at run time (each engine would quantize with its own).
    """
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    model = vllm_config.model_config
    cache = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    quantized = cache.cache_dtype not in ("auto", None)
    if quantized and getattr(cache, "calculate_kv_scales", False):
        raise NotImplementedError(
            "KVStoreConnector cannot share fp8 KV computed with calculate_kv_scales=True: each "
            "engine derives its own scales from its first batch; use static scales (the default)"
        )
    kinds: dict[str, tuple[str, int, Any]] = {}
    members: dict[str, list[int]] = {}
    for g, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        if type(spec) is MLAAttentionSpec:
            kind, window = "mla", 0
        elif type(spec) is SlidingWindowSpec:
            kind, window = "sliding", int(spec.sliding_window)
        elif type(spec) is FullAttentionSpec:
            kind, window = "full", 0
        else:
            raise NotImplementedError(
                f"KVStoreConnector does not move {type(spec).__name__} KV cache groups yet "
                f"(layers {', '.join(group.layer_names[:3])}...): full, sliding-window and MLA "
                "attention are supported; Mamba / linear-attention state is not"
            )
        key = repr(spec)
        kinds.setdefault(key, (kind, window, spec))
        members.setdefault(key, []).append(g)
    model_kv = ""
    if len(kinds) > 1:
        doc = sorted(repr(spec) for _, _, spec in kinds.values())
        model_kv = hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]
    out: list[Segment] = []
    for key, (kind, window, spec) in kinds.items():
        groups = members[key]
        layers = tuple(tuple(kv_cache_config.kv_cache_groups[g].layer_names) for g in groups)
        bs = int(spec.block_size)
        head = int(spec.head_size)
        dtype = str(cache.cache_dtype) if quantized else dtype_name(model.dtype)
        name = packing(vllm_config, model.dtype, bs, head, kind)
        if kind == "mla" and cannot_resume(vllm_config):
            name += ":reference"  # the reference CPU backend; AMX's may pack otherwise
        if quantized:
            name += f"+{spec.kv_quant_mode.name.lower()}"
        heads = int(spec.num_kv_heads)
        page = int(spec.page_size_bytes)
        plain = kind == "full" and not quantized and \
            page == 2 * heads * bs * head * spec.dtype.itemsize
        layout = KVLayout(
            model_id=str(model.model),
            num_layers=sum(len(names) for names in layers),
            num_kv_heads=heads,
            head_dim=head,
            block_size=bs,
            dtype=dtype,
            layout_name=name,
            tp_rank=tp_rank,
            tp_size=int(parallel.tensor_parallel_size),
            kind=kind,
            window=window,
            page=0 if plain else page,
            model_kv=model_kv,
            shared_ranks=kind == "mla",
        )
        k = 0
        if kind == "sliding":
            extra = int(getattr(spec, "extra_retained_tokens", 0) or 0)
            k = max(-(-window // bs), -(-(window - 1 + extra) // bs))
        out.append(Segment(len(out), layout, tuple(groups), layers, k, k * window_stride))
    return out
