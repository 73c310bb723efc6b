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

A ``mamba`` segment (Mamba, gated delta-net and other linear-attention state, vLLM's
``MambaSpec``) is a window of one block: a hit at boundary ``b`` needs only the state block at
position ``b - 1``, the layer's state after ``b * block_size`` tokens (every state tensor of
the layer, packed in one page). vLLM keeps such a state only where a scheduler step ended on a
block boundary (its ``mamba_cache_mode`` "align", on with prefix caching): the other positions
are its null block and are never stored, so the segment stores every state vLLM kept.
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
    needs before its boundary (1 for Mamba state); ``stride_blocks`` (sliding only; 0 keeps
    every block) spaces the windows a sliding segment keeps."""

    index: int
    layout: KVLayout
    groups: tuple[int, ...]
    layers: tuple[tuple[str, ...], ...]
    window_blocks: int = 0
    stride_blocks: int = 0

    @property
    def sliding(self) -> bool:
        """Whether a hit needs only the blocks before its end (sliding window, Mamba)."""
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

    Raises ``NotImplementedError`` for what the connector cannot move: chunked local attention,
    sliding-window MLA, Mamba state that vLLM does not keep at block boundaries (prefix caching
    off) or keeps for speculative decoding, and fp8 caches whose scales are computed at run
    time (each engine would quantize with its own).
    """
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    cache = vllm_config.cache_config
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
        elif type(spec) is MambaSpec:
            _check_mamba(spec, group.layer_names)
            kind, window = "mamba", 0
        else:
            raise NotImplementedError(
                f"KVStoreConnector does not move {type(spec).__name__} KV cache groups yet "
                f"(layers {', '.join(group.layer_names[:3])}...): full, sliding-window, MLA "
                "attention and Mamba / linear-attention state are supported"
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
        num_layers = sum(len(names) for names in layers)
        make = _mamba_layout if kind == "mamba" else _attention_layout
        layout = make(vllm_config, spec, kind, window, num_layers, tp_rank, model_kv)
        k = 0
        if kind == "sliding":
            extra = int(getattr(spec, "extra_retained_tokens", 0) or 0)
            k = max(-(-window // spec.block_size), -(-(window - 1 + extra) // spec.block_size))
        # a state is one block before the hit, and vLLM keeps few: store all it keeps
        stride = k * window_stride if kind == "sliding" else 0
        out.append(Segment(len(out), layout, tuple(groups), layers,
                           1 if kind == "mamba" else k, stride))
    return out


def _attention_layout(vllm_config: Any, spec: Any, kind: str, window: int, num_layers: int,
                      tp_rank: int, model_kv: str) -> KVLayout:
    """The layout of an attention segment (full, sliding or MLA): K and V (or latent) pages."""
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    quantized = cache.cache_dtype not in ("auto", None)
    bs = int(spec.block_size)
    head = int(spec.head_size)
    name = packing(vllm_config, model.dtype, bs, head, kind)
    if kind == "mla" and cannot_resume(vllm_config):
        name += ":reference"  # the reference CPU backend; AMX's may pack otherwise
    if quantized:
        name += f"+{spec.kv_quant_mode.name.lower()}"
    heads = int(spec.num_kv_heads)
    page = int(spec.page_size_bytes)
    plain = kind == "full" and not quantized and \
        page == 2 * heads * bs * head * spec.dtype.itemsize
    return KVLayout(
        model_id=str(model.model),
        num_layers=num_layers,
        num_kv_heads=heads,
        head_dim=head,
        block_size=bs,
        dtype=str(cache.cache_dtype) if quantized else dtype_name(model.dtype),
        layout_name=name,
        tp_rank=tp_rank,
        tp_size=int(vllm_config.parallel_config.tensor_parallel_size),
        kind=kind,
        window=window,
        page=0 if plain else page,
        model_kv=model_kv,
        shared_ranks=kind == "mla",
    )


def _check_mamba(spec: Any, layer_names: list[str]) -> None:
    """Refuse Mamba state that is not one state per block boundary at the block of that
    boundary: without prefix caching (``mamba_cache_mode`` "none") a request has one running
    state, which no later request can resume from; with speculative decoding, state blocks
    move between positions; prefill checkpoints (Mamba2 layers export a boundary's state from
    inside a chunk) are untested, since vLLM 0.32's CPU engine fails on them."""
    where = f"layers {', '.join(layer_names[:3])}..."
    if spec.mamba_cache_mode != "align":
        raise NotImplementedError(
            f"KVStoreConnector moves Mamba / linear-attention state ({where}) only when vLLM "
            "keeps it at block boundaries (mamba_cache_mode 'align', the default with prefix "
            f"caching on); this engine runs with mamba_cache_mode={spec.mamba_cache_mode!r}: "
            "enable prefix caching, or run without the connector"
        )
    if spec.num_speculative_blocks:
        raise NotImplementedError(
            f"KVStoreConnector does not move Mamba state ({where}) with speculative decoding "
            "(its state blocks move between positions)"
        )
    if spec.num_prefill_checkpoint_blocks:
        raise NotImplementedError(
            f"KVStoreConnector does not move Mamba state with prefill checkpoints ({where}; "
            "Mamba2 layers) yet: untested, vLLM 0.32's CPU engine cannot run them"
        )


def _mamba_layout(vllm_config: Any, spec: Any, kind: str, window: int, num_layers: int,
                  tp_rank: int, model_kv: str) -> KVLayout:
    """The layout of a Mamba segment: each layer's page is its state tensors (say conv and
    SSM state) packed one after the other, ``spec.shapes`` of ``spec.dtypes``, without the
    padding vLLM puts after them to match the attention pages' size."""
    model = vllm_config.model_config
    dtypes = [dtype_name(d) for d in spec.dtypes]
    states = "+".join(f"{d}[{'x'.join(map(str, shape))}]"
                      for d, shape in zip(dtypes, spec.shapes, strict=True))
    if len(states) > 80:  # the store caps layout names at 128 characters
        states = hashlib.sha256(states.encode()).hexdigest()[:16]
    device = str(vllm_config.device_config.device_type)
    return KVLayout(
        model_id=str(model.model),
        num_layers=num_layers,
        num_kv_heads=0,
        head_dim=0,
        block_size=int(spec.block_size),
        dtype="+".join(dict.fromkeys(dtypes)),
        layout_name=f"{device}:{spec.mamba_type.name.lower()}:{states}",
        tp_rank=tp_rank,
        tp_size=int(vllm_config.parallel_config.tensor_parallel_size),
        kind=kind,
        window=window,
        page=int(spec.state_content_size_bytes),
        model_kv=model_kv,
        shared_ranks=bool(spec.tp_replicated),
    )
