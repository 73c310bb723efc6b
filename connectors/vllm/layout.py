"""What one engine's KV block is, and the namespace and hash recipe that follow from it.

Both sides of the connector derive the same :class:`KVLayout` per segment from vLLM's config
(:mod:`connectors.vllm.segments`), so the scheduler (which only looks blocks up) and every
worker (which moves their bytes) name the same namespace without talking to each other. The
worker then checks the layout against the real KV tensors before it moves a byte.

A block's bytes are the engine's own pages, copied whole, layer after layer: nothing here
reinterprets them, so the packing inside a page (CPU: K transposed then V for float32, AMX
tiles for bfloat16) must be part of the namespace identity, or two engines that pack
differently would exchange garbage that no checksum can catch.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kvstore.hash_algos import none_hash
from kvstore.namespace import HASH_ALGOS, Layout

_SLUG_RE = re.compile(r"[^A-Za-z0-9._-]+")


# Fields a plain one-group model leaves at their defaults; they enter the namespace digest only
# when set, so the namespaces of models stored before they existed keep their names.
_OPTIONAL = ("kind", "window", "page", "model_kv", "shared_ranks")


@dataclass(frozen=True, slots=True)
class KVLayout:
    """One rank's KV block of one kind of attention: ``num_layers`` pages of ``dtype``
    (``2 * num_kv_heads * block_size * head_dim`` elements unless ``page`` gives the bytes),
    packed as ``layout_name`` says.

    ``kind`` is ``full``, ``sliding`` (``window`` tokens), ``mla`` (one latent per token) or
    ``mamba`` (one state per block: ``dtype`` names each state tensor's, joined by ``+``);
    ``page`` is the page's bytes where the formula above does not give them (MLA, fp8, Mamba);
    ``model_kv`` is a digest of every kind of the model's KV (a layer's KV depends on every
    layer below it, so a hybrid model's full-attention blocks change with its window);
    ``shared_ranks``: every tensor-parallel rank holds the same block (MLA's latent), so
    the namespace carries no rank."""

    model_id: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    layout_name: str
    tp_rank: int = 0
    tp_size: int = 1
    kind: str = "full"
    window: int = 0
    page: int = 0
    model_kv: str = ""
    shared_ranks: bool = False

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=getattr(torch, self.dtype)).element_size()

    @property
    def page_bytes(self) -> int:
        """Bytes of one block in one layer."""
        if self.page:
            return self.page
        return 2 * self.num_kv_heads * self.block_size * self.head_dim * self.itemsize

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers: what the store holds per hash."""
        return self.num_layers * self.page_bytes

    def to_store_layout(self) -> Layout:
        """The layout the store registers for this namespace."""
        return Layout(
            model_id=self.model_id, num_layers=self.num_layers, num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim, block_size=self.block_size, dtype=self.dtype,
            layout_name=self.layout_name,
            extra={"tp_rank": self.tp_rank, "tp_size": self.tp_size, "engine": "vllm",
                   **{k: getattr(self, k) for k in _OPTIONAL
                      if getattr(self, k) != _DEFAULTS[k]}},
        )

    def namespace(self, override: str | None = None) -> str:
        """The store namespace: ``override`` plus the rank when set, else the model name and a
        digest of everything that makes two blocks interchangeable. The hash algorithm and seed
        are deliberately not in the name: an engine that hashes differently must be refused by
        the store (loudly), not given a fresh namespace with a silent zero hit rate."""
        rank = f".tp{self.tp_rank}of{self.tp_size}" \
            if self.tp_size > 1 and not self.shared_ranks else ""
        if override:
            kind = f".{self.kind}" if self.model_kv else ""
            return f"{override}{kind}{rank}"
        doc = asdict(self)
        doc.pop("tp_rank")
        for k in _OPTIONAL:
            if doc[k] == _DEFAULTS[k]:
                doc.pop(k)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
        model = _SLUG_RE.sub("-", self.model_id.rstrip("/").rsplit("/", 1)[-1])[:64] or "model"
        kind = f".{self.kind}" if self.kind != "full" or self.model_kv else ""
        return f"vllm.{model.strip('-.') or 'model'}{kind}.{digest}{rank}"


_DEFAULTS = {k: KVLayout.__dataclass_fields__[k].default for k in _OPTIONAL}


def hash_recipe(algo: str, env: Mapping[str, str]) -> tuple[str, str | None]:
    """``(algo, seed)`` that the engine hashes blocks with: vLLM seeds ``NONE_HASH`` from
    ``PYTHONHASHSEED`` when set, else from a fixed string (SHA-256 algorithms) or random bytes
    per process (xxhash algorithms).

    Raises ``RuntimeError`` when the engine's hashes cannot be reproduced by any other process
    (xxhash without ``PYTHONHASHSEED``): every lookup would miss, and failing at start says why;
    also for an algorithm kvstore namespaces do not record.
    """
    if algo not in HASH_ALGOS:
        raise RuntimeError(
            f"kvstore namespaces record the hash algorithms {', '.join(HASH_ALGOS)}; start vLLM "
            f"with one of them instead of prefix_caching_hash_algo={algo!r}"
        )
    seed = env.get("PYTHONHASHSEED")
    try:
        none_hash(algo, seed)
    except ValueError as exc:
        raise RuntimeError(
            f"KVStoreConnector cannot share blocks hashed with prefix_caching_hash_algo="
            f"{algo!r} here: {exc}"
        ) from exc
    return algo, seed


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``; vLLM cache dtype strings pass through."""
    return str(dtype).removeprefix("torch.")


def packing(vllm_config: Any, dtype: torch.dtype, block_size: int, head_dim: int,
            kind: str = "full") -> str:
    """The attention backend's page layout. On CPU the page interior depends on the kernel
    family vLLM picks for dtype, block size and head size (``amx``, ``vec``, ``vec16``,
    ``neon``...), the same choice its CPU attention backend makes."""
    device = str(vllm_config.device_config.device_type)
    if kind == "mla":
        # MLA pages hold one latent per token, [block_size, kv_lora_rank + rope dims], on
        # every backend that stores them (the CPU one included)
        return f"{device}:mla"
    if device != "cpu":
        # CUDA backends keep K and V as plain [block_size, heads, head_dim] pages.
        return f"{device}:NHD"
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return f"cpu_attn:{_get_attn_isa(dtype, block_size, head_dim, 'auto')}"
