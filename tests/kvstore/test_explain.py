"""``kvstore.explain`` in process: the chain, each status and its precedence, the coverage of
another block size, and the hints (the server's route and CLI are in tests/server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvstore.config import StoreConfig, TierConfig
from kvstore.explain import MAX_OTHER_RECIPES, Prompt, Recipe, explain
from kvstore.explain.recipe import covered
from kvstore.keys import BlockHasher
from kvstore.namespace import Layout, Namespace
from kvstore.store import Store
from kvstore.types import BlockHash

B = 4096
TOKENS = list(range(500, 600))  # 6 blocks of 16, 4 tail tokens


def ns(name: str, block_size: int = 16, algo: str = "sha256", seed: str | None = None) -> Namespace:
    return Namespace(name, B, Layout(block_size=block_size), hash_algo=algo, hash_seed=seed)


@pytest.fixture
def store() -> Iterator[Store]:
    with Store(StoreConfig((TierConfig("host", 64 * B, options={"slot_bytes": B}),))) as s:
        yield s


def put(store: Store, space: Namespace, hashes: list[BlockHash]) -> None:
    store.register_namespace(space)
    store.put(space.name, hashes, [b"k" * B] * len(hashes))


def test_the_chain_is_the_engines_and_statuses_take_precedence(store: Store) -> None:
    base, seeded = ns("base"), ns("seeded", seed="7")
    chain = BlockHasher("sha256", None, 16).hash_blocks(TOKENS, cache_salt="s")
    put(store, base, chain[:3])
    put(store, seeded, BlockHasher("sha256", "7", 16).hash_blocks(TOKENS, cache_salt="s"))
    store.delete("base", chain[1:2])  # a ghost, and its tokens held under "seeded" too
    out = explain(store, base, Prompt(TOKENS, cache_salt="s"), [base, seeded])
    assert [b.hash for b in out.blocks] == chain
    assert [b.status for b in out.blocks] == ["stored", "evicted", "stored"] + \
        ["other_recipe"] * 3
    assert out.blocks[1].ghost is not None and out.blocks[1].ghost.why == "deleted"
    assert [o.namespace for o in out.blocks[1].other] == ["seeded"]  # listed beside the ghost
    assert (out.prefix_blocks, out.prefix_tokens, out.first_miss, out.tail_tokens) == \
        (1, 16, 1, 4)
    assert out.counts == {"stored": 2, "evicted": 1, "other_recipe": 3, "never_seen": 0}
    assert any("block 1 is missing, yet 1 later block is stored" in h for h in out.hints)


def test_another_block_size_covers_a_block_only_where_all_its_tokens_are_stored() -> None:
    stored = [True, False, True]  # blocks of 32 tokens
    assert [covered(s, s + 16, 32, stored) for s in range(0, 112, 16)] == \
        [True, True, False, False, True, True, False]  # the last: no block 3 of 32
    assert covered(0, 32, 16, [True, True]) and not covered(0, 32, 16, [True, False])


def test_a_salt_or_lora_the_stored_blocks_lack_is_a_hint(store: Store) -> None:
    base = ns("base")
    put(store, base, BlockHasher("sha256", None, 16).hash_blocks(TOKENS))
    out = explain(store, base, Prompt(TOKENS, cache_salt="tenant-a"), [base])
    assert out.counts["never_seen"] == 6
    assert any("6 blocks missing here for the same tokens without the cache salt" in h
               for h in out.hints), out.hints
    out = explain(store, base, Prompt(TOKENS, lora_name="l", lora_path="/l"), [base])
    assert any("without the LoRA adapter" in h for h in out.hints), out.hints


def test_a_full_hit_has_no_hint(store: Store) -> None:
    base = ns("base")
    put(store, base, BlockHasher("sha256", None, 16).hash_blocks(TOKENS))
    out = explain(store, base, Prompt(TOKENS[:96]), [base])
    assert out.first_miss is None and out.prefix_blocks == 6 and out.tail_tokens == 0
    assert out.hints == []
    # the tail is the one thing left to say: it is never stored
    out = explain(store, base, Prompt(TOKENS), [base])
    assert out.first_miss is None and out.prefix_blocks == 6
    assert [h.split(":")[0] for h in out.hints] == [
        "the last 4 tokens do not fill a block of 16"]


def test_at_most_so_many_other_recipes_are_tried(store: Store) -> None:
    base = ns("base")
    store.register_namespace(base)
    others = [ns(f"o{i}", seed=str(i)) for i in range(MAX_OTHER_RECIPES + 2)]
    for other in others:
        store.register_namespace(other)
    out = explain(store, base, Prompt(TOKENS), [base, *others])
    assert any(h.startswith("recipes of other namespaces not tried: 2 ") for h in out.hints)
    tiny = ns("tiny", block_size=1)  # 100 blocks of one token: over max_blocks, not hashed
    store.register_namespace(tiny)
    out = explain(store, base, Prompt(TOKENS), [base, tiny], max_blocks=50)
    assert any(h.startswith("recipes of other namespaces not tried: 1 ") for h in out.hints)


def test_recipe_differences_in_words() -> None:
    a, b = Recipe("sha256", None, 16), Recipe("sha256_cbor", "0", 32)
    assert a.differs(b) == ["hash_algo", "hash_seed", "block_size"]
    assert a.describe(b) == [
        "hash algorithm sha256 vs sha256_cbor (vLLM --prefix-caching-hash-algo)",
        "PYTHONHASHSEED differs: unset vs '0'", "block size 16 vs 32 (vLLM --block-size)"]


def test_a_namespace_without_block_size_cannot_be_explained(store: Store) -> None:
    bare = Namespace("bare", B)
    store.register_namespace(bare)
    with pytest.raises(ValueError, match=r"without layout\.block_size"):
        explain(store, bare, Prompt(TOKENS))
    with pytest.raises(ValueError, match="over the limit of 5"):
        explain(store, ns("base"), Prompt(TOKENS), max_blocks=5)
    with pytest.raises(ValueError, match="Python ints"):
        explain(store, ns("base"), Prompt([1.0] * 16))  # type: ignore[list-item]
