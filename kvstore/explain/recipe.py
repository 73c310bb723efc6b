"""How a namespace hashes a prompt: its recipe (hash algorithm, seed, block size), how two
recipes differ in words an operator acts on, and which blocks of one recipe's chain another
recipe's stored blocks cover (the same tokens cut at another block size)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvstore.keys import BlockHasher
from kvstore.namespace import Namespace

RECIPE_FIELDS = ("hash_algo", "hash_seed", "block_size")
MAX_OTHER_RECIPES = 16  # distinct other recipes an explain tries (each hashes the prompt)
MAX_OTHER_NAMESPACES = 64  # namespaces of other recipes an explain looks in
MAX_HASHED_TOKENS = 1 << 20  # tokens an explain hashes in all, over every chain it computes


class Recipe(NamedTuple):
    """What the engine must match for its block hashes to be this namespace's: vLLM's
    ``--prefix-caching-hash-algo``, ``PYTHONHASHSEED`` (None: unset) and ``--block-size``."""

    hash_algo: str
    hash_seed: str | None
    block_size: int

    def hasher(self) -> BlockHasher:
        return BlockHasher(self.hash_algo, self.hash_seed, self.block_size)

    def differs(self, other: Recipe) -> list[str]:
        """The fields of :data:`RECIPE_FIELDS` whose values differ, in that order."""
        return [name for name, a, b in zip(RECIPE_FIELDS, self, other, strict=True) if a != b]

    def describe(self, other: Recipe) -> list[str]:
        """Each difference as a phrase, this recipe's value first: ``block size 16 vs 32``."""
        words = {
            "hash_algo": f"hash algorithm {self.hash_algo} vs {other.hash_algo} "
                         "(vLLM --prefix-caching-hash-algo)",
            "hash_seed": f"PYTHONHASHSEED differs: {_seed(self.hash_seed)} vs "
                         f"{_seed(other.hash_seed)}",
            "block_size": f"block size {self.block_size} vs {other.block_size} "
                          "(vLLM --block-size)",
        }
        return [words[name] for name in self.differs(other)]


def _seed(seed: str | None) -> str:
    return "unset" if seed is None else repr(seed)


def recipe_of(ns: Namespace) -> Recipe | None:
    """The recipe ``ns`` was registered with, or None if it cannot hash a prompt: no
    ``layout.block_size``, or an xxhash algorithm without a seed."""
    recipe = Recipe(ns.hash_algo, ns.hash_seed, ns.layout.block_size)
    try:
        recipe.hasher()
    except ValueError:
        return None
    return recipe


def covered(start: int, end: int, block_size: int, stored: Sequence[bool]) -> bool:
    """Whether tokens ``[start, end)`` lie in blocks of ``block_size`` tokens that are all
    stored (``stored[j]``: block ``j`` of that chain is). A block the chain does not have (the
    prompt ends inside it) is not stored."""
    first, last = start // block_size, (end - 1) // block_size
    return last < len(stored) and all(stored[first:last + 1])
