"""Connector settings, KV layout, namespace names and the hash recipe (no engine needed)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from connectors.vllm.config import ConnectorConfig
from connectors.vllm.layout import KVLayout, hash_recipe
from kvstore.hash_algos import none_hash

LAYOUT = KVLayout(
    model_id="/models/Qwen2.5-0.5B", num_layers=24, num_kv_heads=2, head_dim=64,
    block_size=32, dtype="bfloat16", layout_name="cpu_attn:vec",
)


def test_config_reads_extra_then_environment() -> None:
    cfg = ConnectorConfig.from_extra({"kvstore_url": "http://127.0.0.1:9/"}, env={})
    assert (cfg.url, cfg.token, cfg.namespace, cfg.on_load_error, cfg.load_mode) == (
        "http://127.0.0.1:9", None, None, "recompute", "sync"
    )
    env = {"KVSTORE_URL": "http://h:1", "KVSTORE_TOKEN": "t"}
    cfg = ConnectorConfig.from_extra({"namespace": "shared", "timeout_s": 2}, env=env)
    assert (cfg.url, cfg.token, cfg.namespace, cfg.timeout_s) == ("http://h:1", "t", "shared", 2)
    # a secret mounted as a variable often ends with a newline, which no header can carry
    cfg = ConnectorConfig.from_extra({}, env={**env, "KVSTORE_TOKEN": "t\n"})
    assert cfg.token == "t"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "KVSTORE_URL"),
        ({"kvstore_url": "127.0.0.1:8000"}, "http"),
        ({"kvstore_url": "http://h:1", "kvstore_ulr": "x"}, "unknown"),
        ({"kvstore_url": "http://h:1", "timeout_s": 0}, "positive"),
        ({"kvstore_url": "http://h:1", "on_load_error": "ignore"}, "on_load_error"),
        ({"kvstore_url": "http://h:1", "load_mode": "later"}, "load_mode"),
    ],
)
def test_config_refuses_bad_settings(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ConnectorConfig.from_extra(extra, env={})


def test_block_bytes_count_every_layer_page() -> None:
    # 2 (K and V) x 2 heads x 32 tokens x 64 dims x 2 bytes, times 24 layers.
    assert LAYOUT.page_bytes == 16384
    assert LAYOUT.block_bytes == 24 * 16384


def test_namespace_names_model_and_separates_layouts() -> None:
    name = LAYOUT.namespace()
    assert name.startswith("vllm.Qwen2.5-0.5B.") and name == LAYOUT.namespace()
    others = [
        dataclasses.replace(LAYOUT, dtype="float32"),
        dataclasses.replace(LAYOUT, layout_name="cpu_attn:amx"),
        dataclasses.replace(LAYOUT, block_size=64),
        dataclasses.replace(LAYOUT, model_id="/models/other"),
    ]
    assert len({name, *(o.namespace() for o in others)}) == 5
    ranked = dataclasses.replace(LAYOUT, tp_rank=1, tp_size=2)
    assert ranked.namespace().endswith(".tp1of2")
    assert ranked.namespace("team") == "team.tp1of2" and LAYOUT.namespace("team") == "team"


def test_store_layout_is_the_stores_type_and_round_trips() -> None:
    from kvstore.namespace import Layout

    layout = LAYOUT.to_store_layout()
    assert isinstance(layout, Layout) and layout.dtype == "bfloat16"
    assert Layout(**layout.to_dict()) == layout  # what the wire carries is the same layout


def test_hash_recipe_follows_vllm_seed_rules() -> None:
    assert hash_recipe("sha256", {}) == ("sha256", None)
    assert hash_recipe("sha256_cbor", {"PYTHONHASHSEED": "7"}) == ("sha256_cbor", "7")
    assert hash_recipe("xxhash_cbor", {"PYTHONHASHSEED": "0"}) == ("xxhash_cbor", "0")
    with pytest.raises(RuntimeError, match="random"):
        hash_recipe("xxhash_cbor", {})  # vLLM would seed it with random bytes per process
    assert hash_recipe("xxhash", {"PYTHONHASHSEED": "0"}) == ("xxhash", "0")
    with pytest.raises(RuntimeError, match="record"):
        hash_recipe("md5", {})  # not an algorithm vLLM or kvstore knows


def test_hash_recipe_matches_vllm_none_hash() -> None:
    pytest.importorskip("vllm")
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import resolve_none_hash_seed

    algo, seed = hash_recipe("sha256", os.environ)
    assert none_hash(algo, seed) == sha256(resolve_none_hash_seed(sha256))
