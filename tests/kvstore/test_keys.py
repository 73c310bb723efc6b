"""kvstore.keys: vLLM-compatible chained prefix block hashes.

The vectors in shared/vectors were produced by real vLLM 0.32; every case must match byte for
byte. The other tests pin the parts the vectors do not cover (LoRA, multimodal, xxhash, chain
continuation, input checks) against the formula written out by hand, and, when vLLM is
importable, against vLLM's own functions on random inputs.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from pathlib import Path
from typing import Any

import cbor2
import pytest
import xxhash

from kvstore.keys import (
    ALGOS,
    DEFAULT_NONE_HASH_SEED,
    BlockHasher,
    MMHash,
    block_hashes,
    get_hash_fn,
    none_hash,
)

# shared/ sits beside the checkout; a missing file fails the run rather than skipping it.
VECTORS = Path(__file__).resolve().parents[3] / "shared" / "vectors" / "vllm_block_hashes.json"
CASES: list[dict[str, Any]] = json.loads(VECTORS.read_text())["cases"]


def _case_id(c: dict[str, Any]) -> str:
    return f"{c['algo']}-seed{c['seed']}-bs{c['block_size']}-salt{c['cache_salt']}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_reproduces_vllm_vectors(case: dict[str, Any]) -> None:
    assert none_hash(case["algo"], case["seed"]).hex() == case["none_hash"]
    hasher = BlockHasher(case["algo"], case["seed"], case["block_size"])
    assert hasher.none_hash.hex() == case["none_hash"]
    got = hasher.hash_blocks(case["token_ids"], cache_salt=case["cache_salt"])
    assert [h.hex() for h in got] == case["block_hashes"]
    conv = block_hashes(
        case["token_ids"], case["block_size"], case["algo"], case["seed"], case["cache_salt"]
    )
    assert conv == got


def test_vectors_cover_every_sha256_combination() -> None:
    combos = {(c["algo"], c["seed"], c["block_size"], c["cache_salt"]) for c in CASES}
    assert len(combos) == 16
    assert any(len(c["token_ids"]) % c["block_size"] for c in CASES)  # partial tails exist


# The formula, written out as vLLM's hash_block_tokens computes it.
def _ref_hash(algo: str, obj: Any) -> bytes:
    data = (
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if algo in ("sha256", "xxhash")
        else cbor2.dumps(obj, canonical=True)
    )
    return hashlib.sha256(data).digest() if algo.startswith("sha") else xxhash.xxh3_128_digest(data)


def _ref_chain(
    algo: str, seed: str, tokens: list[int], bs: int, extras: list[tuple[Any, ...] | None]
) -> list[bytes]:
    parent = _ref_hash(algo, seed)
    out = []
    for i in range(len(tokens) // bs):
        parent = _ref_hash(algo, (parent, tuple(tokens[i * bs : (i + 1) * bs]), extras[i]))
        out.append(parent)
    return out


@pytest.mark.parametrize("algo", ALGOS)
def test_matches_formula_for_every_algo(algo: str) -> None:
    rng = random.Random(algo)
    tokens = [rng.randrange(200_000) for _ in range(70)]
    got = BlockHasher(algo, "1234", 16).hash_blocks(
        tokens, cache_salt="s", lora_name="adapter"
    )
    extras: list[tuple[Any, ...] | None] = [(("lora", "adapter"), ("cache_salt", "s"))]
    extras += [(("lora", "adapter"),)] * 3
    assert got == _ref_chain(algo, "1234", tokens, 16, extras)
    assert all(len(h) == (32 if algo.startswith("sha") else 16) for h in got)
    assert get_hash_fn(algo)("x") == _ref_hash(algo, "x")


def test_none_hash_default_seed_and_cache() -> None:
    assert none_hash("sha256") == _ref_hash("sha256", DEFAULT_NONE_HASH_SEED)
    assert none_hash("sha256_cbor", None) == _ref_hash("sha256_cbor", "vllm-none-hash")
    # "0" and "00" are different PYTHONHASHSEED strings and give different chains.
    assert none_hash("sha256", "0") != none_hash("sha256", "00")
    assert none_hash("xxhash_cbor", "7") is none_hash("xxhash_cbor", "7")  # cached


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_xxhash_without_seed_is_refused(algo: str) -> None:
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        none_hash(algo, None)
    with pytest.raises(ValueError, match="needs a seed"):
        BlockHasher(algo, None, 16)
    with pytest.raises(ValueError, match="needs a seed"):
        block_hashes([1] * 32, 16, algo)


def test_only_full_blocks_and_prefix_property() -> None:
    h = BlockHasher("sha256", None, 4)
    tokens = list(range(100, 123))  # 5 full blocks + 3 tokens
    full = h.hash_blocks(tokens)
    assert len(full) == 5
    assert h.hash_blocks(tokens[:3]) == []
    assert h.hash_blocks([]) == []
    # A prefix of the prompt hashes to a prefix of the chain ...
    assert h.hash_blocks(tokens[:12]) == full[:3]
    # ... and a changed token changes its block and every later block, nothing before.
    changed = h.hash_blocks([*tokens[:9], 7, *tokens[10:]])
    assert changed[:2] == full[:2]
    assert all(a != b for a, b in zip(changed[2:], full[2:], strict=True))


def test_parent_continues_the_chain() -> None:
    h = BlockHasher("sha256_cbor", "42", 8)
    tokens = list(range(64))
    whole = h.hash_blocks(tokens, lora_name="a")
    head = h.hash_blocks(tokens[:24], lora_name="a")
    tail = h.hash_blocks(tokens[24:], lora_name="a", parent=head[-1])
    assert head + tail == whole
    # A falsy parent starts a prompt, as in vLLM.
    assert h.hash_blocks(tokens, parent=b"") == h.hash_blocks(tokens)
    with pytest.raises(ValueError, match="cache_salt"):
        h.hash_blocks(tokens[24:], parent=head[-1], cache_salt="t")


def test_salt_enters_first_block_and_changes_the_chain() -> None:
    h = BlockHasher("sha256", None, 16)
    tokens = list(range(48))
    plain, salted = h.hash_blocks(tokens), h.hash_blocks(tokens, cache_salt="tenant")
    assert all(a != b for a, b in zip(plain, salted, strict=True))
    assert h.hash_blocks(tokens, cache_salt="") == plain  # vLLM treats an empty salt as none
    # Only block 0 carries the salt: later blocks hash with no extra keys.
    assert salted[1] == _ref_hash("sha256", (salted[0], tuple(tokens[16:32]), None))
    # Tagging keeps a LoRA name and an equal salt apart.
    assert h.hash_blocks(tokens, lora_name="x") != h.hash_blocks(tokens, cache_salt="x")


def test_multimodal_keys_follow_vllm_walk() -> None:
    bs = 4
    tokens = list(range(1000, 1024))  # 6 blocks
    mm = [MMHash("img-a", 2, 5), ("img-b", 7, 1), MMHash("img-c", 16, 4)]
    got = BlockHasher("sha256", "3", bs).hash_blocks(tokens, mm_hashes=mm, lora_name="L")
    lora = ("lora", "L")
    extras: list[tuple[Any, ...] | None] = [
        (lora, ("img-a", 2)),  # [0,4): img-a starts at 2
        (lora, ("img-a", -2), ("img-b", 3)),  # [4,8): img-a runs on, img-b starts at 7
        (lora,),  # [8,12)
        (lora,),  # [12,16)
        (lora, ("img-c", 0)),  # [16,20): img-c fills the block exactly
        (lora,),  # [20,24)
    ]
    assert got == _ref_chain("sha256", "3", tokens, bs, extras)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown hash algorithm 'md5'.*sha256"):
        BlockHasher("md5", None, 16)
    with pytest.raises(ValueError, match="unknown hash algorithm"):
        get_hash_fn("SHA256")
    for bad in (0, -16, 1.5, True, "16"):
        with pytest.raises(ValueError, match="block_size"):
            BlockHasher("sha256", None, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be a str"):
        none_hash("sha256", 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "tokens, match",
    [
        ([1, 2.0, 3], "float"),
        ([1, True, 3], "bool"),
        ([1, "2", 3], "str"),
        ([1, None], "NoneType"),
        ([1, -1], "-1"),
        ([2**64], "2\\*\\*64"),
        ("abcd", "not a string"),
    ],
)
def test_bad_tokens_are_refused(tokens: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BlockHasher("sha256", None, 1).hash_blocks(tokens)


def test_numpy_ints_are_refused_but_tolist_works() -> None:
    np = pytest.importorskip("numpy")
    arr = np.arange(32, dtype=np.int64)
    with pytest.raises(ValueError, match="int64"):
        block_hashes(arr, 16)
    assert block_hashes(arr.tolist(), 16) == block_hashes(list(range(32)), 16)


def test_bad_multimodal_spans_are_refused() -> None:
    h = BlockHasher("sha256", None, 4)
    with pytest.raises(ValueError, match="sorted"):
        h.hash_blocks(list(range(8)), mm_hashes=[("b", 4, 2), ("a", 0, 2)])
    with pytest.raises(ValueError, match="length"):
        h.hash_blocks(list(range(8)), mm_hashes=[("a", 0, 0)])
    with pytest.raises(ValueError, match="identifier"):
        h.hash_blocks(list(range(8)), mm_hashes=[(b"a", 0, 1)])  # type: ignore[list-item]


def test_hasher_is_frozen() -> None:
    h = BlockHasher()
    with pytest.raises(AttributeError):
        h.block_size = 32  # type: ignore[misc]
