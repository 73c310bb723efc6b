"""The sentences an explanation ends with: what the statuses of a prompt's blocks mean and
what to change, in the order an operator should look (the recipe first, capacity last)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from kvstore.explain.recipe import MAX_HASHED_TOKENS, MAX_OTHER_NAMESPACES, MAX_OTHER_RECIPES
from kvstore.explain.result import Explanation

Variants = dict[str, int]
"""Extra key left out (``cache_salt`` or ``lora``) -> missing blocks stored without it."""

_LEFT = {  # after "N blocks"
    "evicted": "evicted from the {tier} tier to make room (the last at {at}): the store is "
               "too small for the working set; raise {tier}_capacity or add a lower tier",
    "deleted": "deleted by a client from the {tier} tier (the last at {at})",
    "corrupt": "dropped from the {tier} tier because their checksum failed (the last at {at})",
    "lost": "lost by the {tier} tier behind the store's back, e.g. objects gone from the "
            "bucket (the last at {at})",
}
_WITHOUT = {"cache_salt": "without the cache salt: the engine that stored them used none "
                          "(or another)",
            "lora": "without the LoRA adapter: stored for the base model"}


def blocks(count: int) -> str:
    return f"{count} block" if count == 1 else f"{count} blocks"


def when(at: float) -> str:
    """A ghost's time for people: UTC, to the second."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def hints_for(ex: Explanation, *, ghosts_kept: int, ghost_capacity: int, variants: Variants,
              skipped_recipes: int) -> list[str]:
    """Hints for ``ex`` (everything but its hints filled in): none when every block is stored
    and the prompt ends on a block boundary, since there is nothing to change. (An engine that
    misses such a prompt hashes differently or asks another namespace: the heading's recipe
    says what to compare, and docs/operations.md says so.)"""
    bs = ex.recipe.block_size
    out: list[str] = []
    if not ex.blocks:
        out.append(f"the prompt has {ex.tokens} tokens, fewer than one block of {bs}: only "
                   "full blocks are hashed and stored")
    elif ex.tail_tokens:
        out.append(f"the last {ex.tail_tokens} tokens do not fill a block of {bs}: they are "
                   "never stored (only full blocks are)")
    for other in ex.elsewhere:
        out.append(f"namespace {other.namespace!r} holds the tokens of "
                   f"{blocks(other.blocks)} missing here, under another recipe (this "
                   "namespace's value first): " + "; ".join(ex.recipe.describe(other.recipe)))
    for what, count in variants.items():
        out.append(f"this namespace holds {blocks(count)} missing here for the same tokens "
                   + _WITHOUT[what])
    out += _departures(ex)
    never = ex.counts["never_seen"]
    if never:
        if ghost_capacity == 0:
            why = (" as far as the store knows: the ghost record is off (ghost_entries 0), so "
                   "evicted blocks read as never seen")
        elif ghosts_kept >= ghost_capacity:
            why = (f", or left it before the last {ghost_capacity} departures that the ghost "
                   "record keeps (ghost_entries)")
        else:
            why = (", nor under another visible namespace's recipe: no engine has saved these "
                   "tokens (vLLM saves with kv_role kv_producer or kv_both)")
        out.append(f"{blocks(never)} never stored in this namespace{why}")
    stored_after = sum(1 for b in ex.blocks[ex.prefix_blocks:] if b.status == "stored")
    if ex.first_miss is not None and stored_after:
        later = "1 later block is" if stored_after == 1 else f"{stored_after} later blocks are"
        out.append(f"block {ex.first_miss} is missing, yet {later} stored: reuse stops at the "
                   f"first miss, so an engine loads {blocks(ex.prefix_blocks)} "
                   f"({ex.prefix_tokens} tokens)")
    if skipped_recipes:
        out.append(f"recipes of other namespaces not tried: {skipped_recipes} (at most "
                   f"{MAX_OTHER_RECIPES} are, each cutting the prompt into at most the blocks "
                   f"an explain examines, in at most {MAX_OTHER_NAMESPACES} namespaces, "
                   f"hashing at most {MAX_HASHED_TOKENS} tokens in all)")
    return out


def _departures(ex: Explanation) -> list[str]:
    """One hint per (why, tier) of the ghosts of the blocks that left the store."""
    groups: Counter[tuple[str, str]] = Counter()
    last: dict[tuple[str, str], float] = {}
    for b in ex.blocks:
        if b.status == "evicted" and b.ghost is not None:
            key = (b.ghost.why, b.ghost.tier)
            groups[key] += 1
            last[key] = max(last.get(key, 0.0), b.ghost.at)
    return [f"{blocks(count)} " + _LEFT[why].format(tier=tier, at=when(last[(why, tier)]))
            for (why, tier), count in groups.items()]
