"""Why did this miss? A prompt's chain hashed as the engine hashes it, block by block: stored
(in which tiers), evicted (when, from which tier, why), never seen, or stored under another
namespace's recipe (which of hash algorithm, seed and block size differs), with hints.

:func:`explain` is the entry point; :mod:`.recipe` is how a namespace hashes, :mod:`.result`
what comes back and :mod:`.hints` the sentences for an operator.
"""

from __future__ import annotations

from kvstore.explain.explainer import Prompt, explain
from kvstore.explain.recipe import MAX_OTHER_RECIPES, Recipe, recipe_of
from kvstore.explain.result import BlockReport, Elsewhere, Explanation, OtherRecipe, Status

__all__ = [
    "MAX_OTHER_RECIPES",
    "BlockReport",
    "Elsewhere",
    "Explanation",
    "OtherRecipe",
    "Prompt",
    "Recipe",
    "Status",
    "explain",
    "recipe_of",
]
