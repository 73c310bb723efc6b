"""The checkpoints the peers bench races on: ``bench_vllm``'s dense Qwen2.5-0.5B shape and its
Gemma 3 1B-shaped hybrid sliding-window model, each with random weights.

On ``gemma3`` every engine runs with vLLM's hybrid KV cache manager on
(``disable_hybrid_kv_cache_manager=False``: the sliding-window layers keep only the blocks of
their 512-token window); vLLM then refuses to start an engine whose connector does not support
it rather than switching the manager off, so a peer that cannot run on the hybrid manager says
so at start. Its layers are every sixth one full attention, so it needs six layers at least to
be hybrid at all. A peer named in ``--hybrid-off`` runs its engines with the hybrid manager off
instead (every layer keeps, and the store is sent, every block of the prompt), and its rows
say so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from bench_vllm import build_checkpoint, build_gemma3  # bench/ is on sys.path as a script
from peers_store import PeerStore

HYBRID_OFF = {"disable_hybrid_kv_cache_manager": True}


class Model(NamedTuple):
    key: str
    shape: str  # what the checkpoint is shaped like
    build: Callable[[Path, int], None]  # (folder, layers)
    quick_layers: int
    kv_bytes_per_token_layer: int  # K and V of every KV head, float32, in a dense layer
    engine_args: dict[str, Any]  # more ``LLM`` keyword arguments for every engine


MODELS = {
    "qwen2": Model("qwen2", "Qwen2.5-0.5B", build_checkpoint, 2, 2 * 2 * 64 * 4, {}),
    "gemma3": Model(
        "gemma3",
        "Gemma-3-1B",
        build_gemma3,
        6,  # five sliding-window layers and one full-attention layer
        2 * 1 * 256 * 4,
        {"disable_hybrid_kv_cache_manager": False},
    ),
}


def without_hybrid(stores: dict[str, PeerStore], names: set[str]) -> dict[str, PeerStore]:
    """``stores``, those in ``names`` with their engines' hybrid KV cache manager off and
    named so in the rows."""
    out: dict[str, PeerStore] = {}
    for name, store in stores.items():
        if name in names:
            store.engine_args = dict(HYBRID_OFF)
            name = f"{name} (hybrid off)"
        out[name] = store
    return out
