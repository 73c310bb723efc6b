"""The hash algorithms vLLM 0.32 offers for prefix caching, and ``NONE_HASH``.

Algorithms (``--prefix-caching-hash-algo`` in vLLM):

==============  ==========================================================  ============
name            hash of an object                                           digest
==============  ==========================================================  ============
``sha256``      SHA-256 of ``pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)``    32 bytes
``sha256_cbor`` SHA-256 of canonical CBOR (``cbor2``), language-neutral      32 bytes
``xxhash``      XXH3-128 of the pickle                                       16 bytes
``xxhash_cbor`` XXH3-128 of canonical CBOR                                   16 bytes
==============  ==========================================================  ============

vLLM gives the two xxhash algorithms a random per-process seed when ``PYTHONHASHSEED`` is unset
(a predictable seed would let an attacker precompute collisions for a non-cryptographic hash).
Such hashes never match across processes, so here a seed is required for them: asking for one
without a seed raises ``ValueError`` instead of silently yielding a zero hit rate.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
from collections.abc import Callable
from typing import Any, Literal, get_args

import cbor2
import xxhash

from kvstore.types import BlockHash

HashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
ALGOS: tuple[str, ...] = get_args(HashAlgo)
"""Every algorithm name vLLM accepts for ``--prefix-caching-hash-algo``."""

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""Seed of ``NONE_HASH`` for the SHA-256 algorithms when no seed is configured (vLLM's
``DEFAULT_NONE_HASH_SEED``)."""

RANDOM_SEED_ALGOS = frozenset({"xxhash", "xxhash_cbor"})
PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL  # what vLLM pickles with (5 on Python 3.11)


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=PICKLE_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=PICKLE_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


HASH_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}
# The same four as (pickled?, digest constructor), for the hot loop in _chain.
PICKLED = frozenset({"sha256", "xxhash"})
DIGESTS: dict[str, Callable[[bytes], Any]] = {
    "sha256": hashlib.sha256,
    "sha256_cbor": hashlib.sha256,
    "xxhash": xxhash.xxh3_128,
    "xxhash_cbor": xxhash.xxh3_128,
}


def get_hash_fn(algo: str) -> Callable[[Any], bytes]:
    """The function vLLM's algorithm ``algo`` hashes one object with (see the module table).

    Raises ``ValueError`` naming the known algorithms when ``algo`` is not one of them."""
    try:
        return HASH_FNS[algo]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown hash algorithm {algo!r}; known: {', '.join(ALGOS)}"
        ) from None


@functools.cache
def none_hash(algo: str, seed: str | None = None) -> BlockHash:
    """``NONE_HASH``, the parent of a prompt's first block: ``hash_fn(seed)``.

    ``seed`` is the engine's ``PYTHONHASHSEED`` string (``"0"`` and ``"00"`` differ, as in
    vLLM); ``None`` means it is unset, which selects ``DEFAULT_NONE_HASH_SEED`` for the SHA-256
    algorithms. Cached per ``(algo, seed)``. Raises ``ValueError`` for an unknown algorithm, a
    seed that is not a string, or an xxhash algorithm without a seed (vLLM then draws a random
    per-process seed that no other process can reproduce).
    """
    hash_fn = get_hash_fn(algo)
    if seed is None:
        if algo in RANDOM_SEED_ALGOS:
            raise ValueError(
                f"{algo} needs a seed: without PYTHONHASHSEED vLLM seeds {algo} with random "
                "bytes per process, so no other process can reproduce its block hashes; start "
                "vLLM with PYTHONHASHSEED set and pass the same value as seed"
            )
        seed = DEFAULT_NONE_HASH_SEED
    elif not isinstance(seed, str):
        raise ValueError(f"seed must be a str (the PYTHONHASHSEED value) or None, got {seed!r}")
    return BlockHash(hash_fn(seed))
