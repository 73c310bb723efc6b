"""Explain a prompt against a namespace: hash it with the namespace's recipe, ask the store
where each block is (and the ghost of each that left), look for the missing blocks' tokens
under the other namespaces' recipes, and say what it means.

A thin layer over :meth:`~kvstore.store.Store.trace`: it reads, never changes, the store, and
it knows nothing of tenants (the caller passes the namespaces the asker may see).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvstore.errors import UnknownNamespaceError
from kvstore.explain.hints import Variants, hints_for
from kvstore.explain.recipe import (
    MAX_HASHED_TOKENS,
    MAX_OTHER_NAMESPACES,
    MAX_OTHER_RECIPES,
    Recipe,
    covered,
    recipe_of,
)
from kvstore.explain.result import (
    STATUSES,
    BlockReport,
    Elsewhere,
    Explanation,
    OtherRecipe,
    Status,
)
from kvstore.keys import MMHash
from kvstore.namespace import Namespace
from kvstore.store.api import StoreAPI
from kvstore.types import BlockHash


@dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt as the engine sees it: its token ids and the extra keys vLLM hashes with them
    (see :meth:`kvstore.keys.BlockHasher.hash_blocks`)."""

    tokens: Sequence[int]
    cache_salt: str | None = None
    lora_name: str | None = None
    lora_path: str | None = None
    mm_hashes: tuple[MMHash, ...] = ()

    def hashes(self, recipe: Recipe) -> list[BlockHash]:
        """The chain ``recipe`` gives this prompt; ``ValueError`` on bad tokens or keys."""
        return recipe.hasher().hash_blocks(
            self.tokens, cache_salt=self.cache_salt, lora_name=self.lora_name,
            lora_path=self.lora_path, mm_hashes=self.mm_hashes or None)


def explain(store: StoreAPI, ns: Namespace, prompt: Prompt, others: Iterable[Namespace] = (),
            *, max_blocks: int | None = None,
            shown: Callable[[str], str] | None = None) -> Explanation:
    """Block by block, why ``prompt`` hits or misses in ``ns``; ``others`` are the namespaces
    whose recipes are tried for the missing blocks (``ns`` itself and those with the same
    recipe are skipped; at most :data:`MAX_OTHER_RECIPES` distinct recipes are hashed, each
    only if it cuts the prompt into at most ``max_blocks`` blocks, and at most
    :data:`MAX_OTHER_NAMESPACES` namespaces looked in). Every chain hashed (the prompt's own,
    without its salt or LoRA, under other recipes) costs the prompt's tokens, and no more than
    :data:`MAX_HASHED_TOKENS` are hashed in all: one explain's work is bounded whatever
    namespaces are registered. ``shown`` gives the name the asker calls a
    namespace by (the store's name by default): the result and its hints name namespaces so.

    Raises ``ValueError`` when ``ns`` cannot hash a prompt (registered without
    ``layout.block_size``), on bad tokens or extra keys, and past ``max_blocks`` full blocks;
    :class:`~kvstore.errors.UnknownNamespaceError` if ``ns`` is gone.
    """
    recipe = recipe_of(ns)
    if recipe is None:
        raise ValueError(f"namespace {ns.local_name!r} was registered without "
                         "layout.block_size (or with an xxhash algorithm and no seed): its "
                         "chain cannot be computed")
    full = len(prompt.tokens) // recipe.block_size
    if max_blocks is not None and full > max_blocks:  # refused before any hashing
        raise ValueError(f"the prompt has {full} full blocks of {recipe.block_size} tokens, "
                         f"over the limit of {max_blocks} blocks an explain examines")
    hashes = prompt.hashes(recipe)
    budget = _Budget(MAX_HASHED_TOKENS - len(prompt.tokens), len(prompt.tokens))
    bs = recipe.block_size
    trace = store.trace(ns.name, hashes)
    blocks = [BlockReport(i, i * bs, (i + 1) * bs, h, tiers=tiers, ghost=ghost)
              for i, (h, tiers, ghost) in enumerate(zip(hashes, trace.tiers, trace.ghosts,
                                                        strict=True))]
    missing = [b for b in blocks if not b.tiers]
    elsewhere: list[Elsewhere] = []
    skipped = 0
    variants: Variants = {}
    if missing:
        variants = _variants(store, ns.name, recipe, prompt, missing, budget)
        elsewhere, skipped = _find_elsewhere(store, ns.name, recipe, prompt, others, missing,
                                             max_blocks, budget)
    for b in blocks:
        b.status = _status(b)
    prefix = next((b.index for b in blocks if b.status != "stored"), len(blocks))
    counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for b in blocks:
        counts[b.status] += 1
    out = Explanation(
        namespace=ns.name, recipe=recipe, tokens=len(prompt.tokens),
        tail_tokens=len(prompt.tokens) - len(blocks) * bs, prefix_blocks=prefix,
        prefix_tokens=prefix * bs, first_miss=prefix if prefix < len(blocks) else None,
        counts=counts, blocks=blocks, elsewhere=elsewhere, hints=[])
    if shown is not None:
        _rename(out, shown)
    out.hints = hints_for(out, ghosts_kept=trace.ghosts_kept,
                          ghost_capacity=trace.ghost_capacity, variants=variants,
                          skipped_recipes=skipped)
    return out


@dataclass(slots=True)
class _Budget:
    """The tokens an explain may still hash; each further chain costs ``per_chain``."""

    left: int
    per_chain: int

    def spend(self) -> bool:
        if self.per_chain > self.left:
            return False
        self.left -= self.per_chain
        return True


def _rename(out: Explanation, shown: Callable[[str], str]) -> None:
    """Name every namespace in ``out`` as ``shown`` says (before its hints are written)."""
    out.namespace = shown(out.namespace)
    out.elsewhere = [e._replace(namespace=shown(e.namespace)) for e in out.elsewhere]
    for b in out.blocks:
        b.other = [o._replace(namespace=shown(o.namespace)) for o in b.other]


def _status(b: BlockReport) -> Status:
    if b.tiers:
        return "stored"
    if b.ghost is not None:
        return "evicted"
    return "other_recipe" if b.other else "never_seen"


def _find_elsewhere(store: StoreAPI, name: str, recipe: Recipe, prompt: Prompt,
                    others: Iterable[Namespace], missing: list[BlockReport],
                    max_blocks: int | None, budget: _Budget) -> tuple[list[Elsewhere], int]:
    """Fill in ``other`` of the missing blocks from the namespaces whose recipe differs; the
    namespaces that hold any, and how many distinct recipes went untried (past
    :data:`MAX_OTHER_RECIPES`, :data:`MAX_OTHER_NAMESPACES` or the hashing budget, or cutting
    the prompt into more than ``max_blocks`` blocks: the work of one explain stays bounded
    whatever block sizes are registered)."""
    by_recipe: dict[Recipe, list[str]] = {}
    for ns in others:
        theirs = recipe_of(ns)
        if ns.name != name and theirs is not None and theirs != recipe:
            by_recipe.setdefault(theirs, []).append(ns.name)
    found: list[Elsewhere] = []
    tried = [r for r in by_recipe
             if max_blocks is None or len(prompt.tokens) // r.block_size <= max_blocks]
    done = looked = 0
    for theirs in tried[:MAX_OTHER_RECIPES]:
        names = by_recipe[theirs]
        if looked >= MAX_OTHER_NAMESPACES or not budget.spend():
            break
        done += 1
        hashes = prompt.hashes(theirs)  # the same tokens and keys: valid under any recipe
        if not hashes:
            continue  # fewer tokens than one of its blocks
        differs = recipe.differs(theirs)
        for other in sorted(names)[:MAX_OTHER_NAMESPACES - looked]:
            looked += 1
            try:
                stored = [bool(t) for t in store.trace(other, hashes).tiers]
            except UnknownNamespaceError:
                continue  # deleted meanwhile
            hits = [b for b in missing if covered(b.start, b.end, theirs.block_size, stored)]
            for b in hits:
                b.other.append(OtherRecipe(other, differs))
            if hits:
                found.append(Elsewhere(other, theirs, differs, len(hits)))
    return found, len(by_recipe) - done


def _variants(store: StoreAPI, name: str, recipe: Recipe, prompt: Prompt,
              missing: list[BlockReport], budget: _Budget) -> Variants:
    """How many missing blocks the namespace holds for the prompt hashed without its cache
    salt, or without its LoRA adapter: the engine that stored them ran without it."""
    tries: list[tuple[str, Prompt]] = []
    if prompt.cache_salt:
        tries.append(("cache_salt", dataclasses.replace(prompt, cache_salt=None)))
    if prompt.lora_name is not None:
        tries.append(("lora", dataclasses.replace(prompt, lora_name=None, lora_path=None)))
    out: Variants = {}
    for what, variant in tries:
        if not budget.spend():
            break
        stored = store.trace(name, variant.hashes(recipe)).tiers
        count = sum(1 for b in missing if stored[b.index])
        if count:
            out[what] = count
    return out
