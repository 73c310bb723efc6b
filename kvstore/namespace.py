"""Namespaces: one block layout, one block size and one hash recipe per namespace.

Every block of a namespace has the same byte size. The hash algorithm and seed are part of the
namespace because a client hashing with another seed would silently get a zero hit rate: we
refuse the registration instead.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kvstore.errors import BlockSizeError, NamespaceConflictError, UnknownNamespaceError
from kvstore.hash_algos import ALGOS

HASH_ALGOS = ALGOS  # every algorithm kvstore.keys reproduces, vLLM's four
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$")


@dataclass(frozen=True, slots=True)
class Layout:
    """How the engine lays out one block's KV. Opaque to the store except for identity."""

    model_id: str = ""
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    block_size: int = 0
    dtype: str = ""
    layout_name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"layout.{name} must be a non-negative integer, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Namespace:
    """A registered namespace. ``layout_id`` is a short stable digest of everything that must
    match for two blocks to be interchangeable; tiers store it beside each block."""

    name: str
    block_bytes: int
    layout: Layout = field(default_factory=Layout)
    hash_algo: str = "sha256"
    hash_seed: str | None = None
    tenant: str | None = None
    layout_id: int = field(init=False, compare=False, repr=False, default=0)

    def __post_init__(self) -> None:
        self._validate()
        # computed once: puts stamp it on every block
        doc = json.dumps(
            [self.name, self.block_bytes, self.layout.to_dict(), self.hash_algo, self.hash_seed],
            sort_keys=True,
        )
        digest = int.from_bytes(hashlib.sha256(doc.encode()).digest()[:8], "little")
        object.__setattr__(self, "layout_id", digest)

    def _validate(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(
                "namespace name must be 1-128 characters of letters, digits and ._:@+=- "
                f"starting with a letter or digit, got {self.name!r}"
            )
        if not isinstance(self.block_bytes, int) or isinstance(self.block_bytes, bool) \
                or self.block_bytes <= 0:
            raise ValueError(f"block_bytes must be a positive integer, got {self.block_bytes!r}")
        if self.hash_algo not in HASH_ALGOS:
            known = ", ".join(HASH_ALGOS)
            raise ValueError(f"unknown hash_algo {self.hash_algo!r}; known: {known}")
        if self.hash_seed is not None and not isinstance(self.hash_seed, str):
            raise ValueError("hash_seed must be a string or null")


    def identity(self) -> tuple[Any, ...]:
        """What must be equal for a re-registration to be accepted (tenant excluded)."""
        return (self.block_bytes, self.layout, self.hash_algo, self.hash_seed)

    def check_size(self, size: int) -> None:
        if size != self.block_bytes:
            raise BlockSizeError(
                f"block of {size} bytes does not match namespace {self.name!r}, "
                f"whose blocks are {self.block_bytes} bytes"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "block_bytes": self.block_bytes,
            "layout": self.layout.to_dict(),
            "hash_algo": self.hash_algo,
            "hash_seed": self.hash_seed,
            "tenant": self.tenant,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Namespace:
        layout = doc.get("layout") or {}
        return cls(
            name=doc["name"],
            block_bytes=doc["block_bytes"],
            layout=Layout(**layout),
            hash_algo=doc.get("hash_algo", "sha256"),
            hash_seed=doc.get("hash_seed"),
            tenant=doc.get("tenant"),
        )


class NamespaceRegistry:
    """Registered namespaces by name. Not thread-safe on its own; the store serialises access."""

    def __init__(self) -> None:
        self._by_name: dict[str, Namespace] = {}

    def register(self, ns: Namespace) -> bool:
        """Add ``ns``. Returns True if new, False if an identical one exists; raises
        :class:`NamespaceConflictError` if one exists with another layout, size or hash."""
        have = self._by_name.get(ns.name)
        if have is None:
            self._by_name[ns.name] = ns
            return True
        if have.identity() != ns.identity():
            diffs = [
                f"{k}: registered {a!r}, requested {b!r}"
                for k, a, b in zip(
                    ("block_bytes", "layout", "hash_algo", "hash_seed"),
                    have.identity(), ns.identity(), strict=True,
                )
                if a != b
            ]
            raise NamespaceConflictError(
                f"namespace {ns.name!r} already exists with a different definition ("
                + "; ".join(diffs) + ")"
            )
        return False

    def get(self, name: str) -> Namespace:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownNamespaceError(f"unknown namespace {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def all(self) -> list[Namespace]:
        return list(self._by_name.values())
