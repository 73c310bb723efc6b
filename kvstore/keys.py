"""Chained prefix block hashes, byte for byte as vLLM 0.32 computes them for prefix caching.

A prompt is cut into full blocks of ``block_size`` tokens (a trailing partial block is never
hashed). Block ``i`` hashes ``(parent, tuple(block_tokens), extra_keys)`` where ``parent`` is
block ``i-1``'s hash, or ``NONE_HASH`` for the first block, so each hash names the whole prefix
that ends at its block boundary. ``NONE_HASH = hash_fn(seed)``; the seed is the one the engine
runs with (vLLM reads ``PYTHONHASHSEED``), else the fixed string ``"vllm-none-hash"`` for the
SHA-256 algorithms. ``extra_keys`` is ``None`` or a tuple, in vLLM's order, of the tagged keys
``("lora", lora_name, lora_path)`` on every block of a LoRA request, ``("mm", identifier,
offset_in_block)`` for every multimodal input that overlaps the block, and ``("cache_salt",
salt)`` on the first block only. (vLLM 0.32 tags them; older releases used bare values, and its
KV events still publish the bare form.)

The hash algorithms and ``NONE_HASH`` are in :mod:`kvstore.hash_algos`.

Not covered: requests with prompt embeddings (vLLM adds a digest of the embedding tensor).
A caveat inherited from pickle (``sha256``, ``xxhash``): it writes an object that occurs twice
in one block's key as a back-reference, so a block whose extra keys repeat the *same* string
object (say ``lora_name`` passed as ``lora_path`` too) hashes differently from one holding two
equal copies. vLLM has the same property; real keys (names, paths, content hashes) differ.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from operator import countOf
from typing import Any, NamedTuple, cast

import cbor2

from kvstore.hash_algos import (
    DIGESTS,
    HASH_FNS,
    PICKLE_PROTOCOL,
    PICKLED,
    none_hash,
)
from kvstore.types import BlockHash


class MMHash(NamedTuple):
    """A multimodal input of a prompt: vLLM's ``mm_feature.identifier`` (its content hash) and
    its placeholder span, ``offset`` and ``length`` in tokens from the first token passed."""

    identifier: str
    offset: int
    length: int


def _as_tokens(token_ids: Sequence[int]) -> tuple[int, ...]:
    """``token_ids`` as a tuple after checking that every one is a Python ``int``.

    A tuple because slicing it yields the per-block tuples directly (one allocation per block,
    as in vLLM). The exact type matters: ``bool``, numpy integers or floats pickle or
    CBOR-encode differently from the ``int`` vLLM hashes and would silently change every hash.
    Values are not range-checked: vLLM hashes whatever ints it holds, and this check is the
    only per-token pass we add to vLLM's work, so it stays one C-level pass.
    """
    if isinstance(token_ids, str | bytes):
        raise ValueError("token_ids must be a sequence of ints, not a string")
    toks = tuple(token_ids)
    # countOf over the types compares by identity first: no Python call per token.
    if countOf(map(type, toks), int) != len(toks):
        names = ", ".join(sorted({type(t).__name__ for t in toks if type(t) is not int}))
        raise ValueError(f"token ids must be Python ints; got {names} (convert with .tolist())")
    return toks


def _check_mm(mm_hashes: Sequence[MMHash | tuple[str, int, int]]) -> list[MMHash]:
    """``mm_hashes`` as :class:`MMHash` entries, or ``ValueError`` naming the bad one."""
    try:
        out = [MMHash(*m) for m in mm_hashes]
    except TypeError:
        raise ValueError("mm_hashes entries must be (identifier, offset, length)") from None
    prev = -1
    for m in out:
        if not isinstance(m.identifier, str):
            raise ValueError(f"mm identifier must be a str, got {m.identifier!r}")
        if type(m.offset) is not int or type(m.length) is not int:
            raise ValueError(f"mm offset and length must be ints, got {m!r}")
        if m.offset < 0 or m.length <= 0:
            raise ValueError(f"mm offset must be >= 0 and length > 0, got {m!r}")
        if m.offset < prev:
            raise ValueError("mm_hashes must be sorted by offset, as vLLM assumes")
        prev = m.offset
    return out


def _mm_keys(mm: list[MMHash], start: int, end: int, idx: int) -> tuple[list[Any], int]:
    """vLLM's walk over the sorted multimodal inputs for block ``[start, end)``, from input
    ``idx`` on: ``("mm", identifier, offset - start)`` for each input overlapping the block,
    and the input the next block starts from. Kept step for step so that odd layouts (touching
    or overlapping spans) give vLLM's keys, not merely plausible ones."""
    keys: list[Any] = []
    last = mm[-1]
    if last.offset + last.length <= start:
        return keys, idx
    while idx < len(mm):
        identifier, offset, length = mm[idx]
        if end <= offset:
            break  # the block ends before this input starts
        if start >= offset + length:
            idx += 1  # the block starts after this input ends
            continue
        keys.append(("mm", identifier, offset - start))
        if end >= offset + length:
            idx += 1  # this input ends in the block; the next one may start in it too
        else:
            break
    return keys, idx


@dataclass(frozen=True, slots=True)
class BlockHasher:
    """Chained block hashing for one engine configuration: ``algo`` (one of
    :data:`kvstore.hash_algos.ALGOS`), ``seed`` (the engine's ``PYTHONHASHSEED``, ``None`` when
    unset) and ``block_size``.

    Construction validates all three and derives ``NONE_HASH`` at once, so a misconfigured
    hasher fails here (``ValueError``), not on first use. Immutable and safe to share.
    """

    algo: str = "sha256"
    seed: str | None = None
    block_size: int = 16

    def __post_init__(self) -> None:
        if type(self.block_size) is not int or self.block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {self.block_size!r}")
        none_hash(self.algo, self.seed)  # raises on an unknown algo or a missing xxhash seed

    @property
    def none_hash(self) -> BlockHash:
        """The parent hash of a prompt's first block."""
        return none_hash(self.algo, self.seed)

    def hash_blocks(
        self,
        token_ids: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
        mm_hashes: Sequence[MMHash | tuple[str, int, int]] | None = None,
        parent: bytes | None = None,
    ) -> list[BlockHash]:
        """Hashes of the full blocks of ``token_ids``, in order, each chained on the previous.

        ``parent`` continues a chain: ``token_ids`` then follow the block whose hash it is
        (``None`` or empty: they start a prompt, as vLLM treats a falsy parent).
        ``cache_salt`` enters the first block of a prompt only (an empty salt is none, as in
        vLLM), so it cannot be combined with ``parent``. ``lora_name`` and ``lora_path`` (the
        ``LoRARequest``'s, both or neither) enter every block.
        ``mm_hashes`` lists multimodal inputs sorted by offset, offsets counted from
        ``token_ids[0]``. Returns ``len(token_ids) // block_size`` hashes; the tokens after the
        last full block are checked but not hashed. Raises ``ValueError`` on tokens that are not
        Python ints, bad multimodal spans, half a LoRA, or a salt with a parent.
        """
        toks = _as_tokens(token_ids)
        if parent and cache_salt:
            raise ValueError(
                "cache_salt enters only the first block of a prompt; with parent set the "
                "tokens continue a prompt, so hash the salted prompt from its start"
            )
        if (lora_name is None) != (lora_path is None):
            raise ValueError("lora_name and lora_path go together: vLLM hashes both")
        mm = _check_mm(mm_hashes) if mm_hashes else []
        lora: list[Any] = [("lora", lora_name, lora_path)] if lora_name is not None else []
        salt: list[Any] = [("cache_salt", cache_salt)] if cache_salt else []

        hash_fn = HASH_FNS[self.algo]
        bs = self.block_size
        end = len(toks) - len(toks) % bs
        prev: bytes = parent or none_hash(self.algo, self.seed)
        out: list[BlockHash] = []
        if end == 0:
            return out
        if mm:
            # Multimodal prompts build keys per block, as vLLM does; rare and short.
            idx = 0
            for start in range(0, end, bs):
                mm_keys, idx = _mm_keys(mm, start, start + bs, idx)
                keys = lora + mm_keys + (salt if start == 0 else [])
                prev = hash_fn((prev, toks[start : start + bs], tuple(keys) if keys else None))
                out.append(BlockHash(prev))
            return out

        # Text prompts: the extra keys differ only on the first block.
        first = lora + salt
        prev = hash_fn((prev, toks[:bs], tuple(first) if first else None))
        out.append(BlockHash(prev))
        # BlockHash is bytes at run time: the hot loop appends digests as they come
        _chain(self.algo, toks, bs, end, prev, tuple(lora) if lora else None,
               cast("list[bytes]", out))
        return out


def _chain(
    algo: str,
    toks: tuple[int, ...],
    bs: int,
    end: int,
    prev: bytes,
    extra: tuple[Any, ...] | None,
    out: list[bytes],
) -> None:
    """Append to ``out`` the hashes of blocks ``[bs, end)`` of ``toks``, chained on ``prev``,
    all with the same ``extra`` keys.

    The hot loop: per block one tuple slice, one serialization and one digest, all in C, and
    no Python call (vLLM's hasher makes about eight per block); one loop per serializer so that
    neither goes through a wrapper.
    """
    new = DIGESTS[algo]
    append = out.append
    if algo in PICKLED:
        dumps, protocol = pickle.dumps, PICKLE_PROTOCOL
        for start in range(bs, end, bs):
            prev = new(dumps((prev, toks[start : start + bs], extra), protocol)).digest()
            append(prev)
    else:
        cbor_dumps = cbor2.dumps
        for start in range(bs, end, bs):
            prev = new(cbor_dumps((prev, toks[start : start + bs], extra), canonical=True)).digest()
            append(prev)


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    algo: str = "sha256",
    seed: str | None = None,
    cache_salt: str | None = None,
) -> list[BlockHash]:
    """Full-block chained hashes of one prompt; ``BlockHasher(algo, seed, block_size)
    .hash_blocks(token_ids, cache_salt=cache_salt)`` (see there for contract and errors)."""
    return BlockHasher(algo, seed, block_size).hash_blocks(token_ids, cache_salt=cache_salt)
