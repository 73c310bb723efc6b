"""Namespaces: one block layout, one block size and one hash recipe per namespace.

Every block of a namespace has the same byte size. The hash algorithm and seed are part of the
namespace because a client hashing with another seed would silently get a zero hit rate: we
refuse the registration instead.

The checks in ``__post_init__`` are the one validation of a namespace: REST's schema and the
data plane's ``register`` both end in them, and the namespaces file is read back through them.
Every field is bounded (the caps below), so that one registration cannot make the file, the
listing or the store's memory grow without limit.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from kvstore.errors import BlockSizeError, NamespaceConflictError, UnknownNamespaceError
from kvstore.hash_algos import ALGOS

HASH_ALGOS = ALGOS  # every algorithm kvstore.keys reproduces, vLLM's four
_NAME = r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}"  # a name, and a tenant's name
_NAME_RE = re.compile(rf"^{_NAME}$")
# Between a tenant and its name in the store's name of a tenant's namespace. No name or tenant
# holds it, and it is none of what the tiers give a meaning: NUL (LMDB keys) or / (S3 keys).
TENANT_SEP = "~"
_STORE_NAME_RE = re.compile(rf"^(?:{_NAME}{TENANT_SEP})?{_NAME}$")
MAX_BLOCK_BYTES = 1 << 31  # bytes of one block
MAX_SEED_CHARS = 1024  # characters of hash_seed
MAX_TENANT_CHARS = 128  # characters of a tenant name
MAX_LAYOUT_INT = 1 << 20  # num_layers, num_kv_heads, head_dim, block_size
MAX_LAYOUT_STR = {"model_id": 512, "dtype": 64, "layout_name": 128}  # characters
MAX_EXTRA_DEPTH = 8  # nesting of layout.extra (the map itself is depth 1)
MAX_EXTRA_BYTES = 4096  # layout.extra as compact JSON


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
            if not isinstance(value, int) or isinstance(value, bool) \
                    or not 0 <= value <= MAX_LAYOUT_INT:
                raise ValueError(f"layout.{name} must be an integer from 0 to {MAX_LAYOUT_INT}, "
                                 f"got {value!r}")
        for name, most in MAX_LAYOUT_STR.items():
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > most:
                raise ValueError(f"layout.{name} must be a string of at most {most} characters")
        _check_extra(self.extra)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Namespace:
    """A registered namespace. ``layout_id`` is a short stable digest of everything that must
    match for two blocks to be interchangeable; tiers store it beside each block.

    ``name`` is the store's name, which keys the namespace's blocks in every tier. A tenant's
    namespace is ``tenant~name`` (:func:`store_name`), so that two tenants may both have
    ``chat``; its tenant calls it by :attr:`local_name`. A tenant's namespace with a plain name
    is one registered before names were scoped per tenant: it keeps its name (and so its
    stored blocks), and its tenant calls it by that name.
    """

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
        if not isinstance(self.name, str) or not _STORE_NAME_RE.match(self.name):
            raise ValueError(
                "namespace name must be 1-128 characters of letters, digits and ._:@+=- "
                f"starting with a letter or digit, got {self.name!r}"
            )
        if not isinstance(self.block_bytes, int) or isinstance(self.block_bytes, bool) \
                or not 0 < self.block_bytes <= MAX_BLOCK_BYTES:
            raise ValueError(f"block_bytes must be an integer from 1 to {MAX_BLOCK_BYTES}, "
                             f"got {self.block_bytes!r}")
        if not isinstance(self.layout, Layout):
            raise ValueError("layout must be a Layout")
        if not isinstance(self.hash_algo, str) or self.hash_algo not in HASH_ALGOS:
            known = ", ".join(HASH_ALGOS)
            raise ValueError(f"unknown hash_algo {self.hash_algo!r:.80}; known: {known}")
        if self.hash_seed is not None and (not isinstance(self.hash_seed, str)
                                           or len(self.hash_seed) > MAX_SEED_CHARS):
            raise ValueError(f"hash_seed must be null or a string of at most {MAX_SEED_CHARS} "
                             "characters")
        if self.tenant is not None:
            check_tenant_name(self.tenant)
        owner, sep, _ = self.name.rpartition(TENANT_SEP)
        if sep and owner != self.tenant:
            raise ValueError(f"namespace {self.name!r} is tenant {owner!r}'s: its tenant must "
                             f"be {owner!r}, got {self.tenant!r}")

    @property
    def local_name(self) -> str:
        """The name its tenant calls it by: :attr:`name` without the tenant."""
        return self.name.rpartition(TENANT_SEP)[2]

    def identity(self) -> tuple[Any, ...]:
        """What must be equal for a re-registration to be accepted (tenant excluded)."""
        return (self.block_bytes, self.layout, self.hash_algo, self.hash_seed)

    def check_size(self, size: int) -> None:
        if size != self.block_bytes:
            raise BlockSizeError(
                f"block of {size} bytes does not match namespace {self.local_name!r}, "
                f"whose blocks are {self.block_bytes} bytes"
            )

    def check_sizes(self, sizes: Iterable[int]) -> None:
        """:meth:`check_size` of each size, in order (raises on the first wrong one)."""
        want = self.block_bytes
        for size in sizes:
            if size != want:
                self.check_size(size)

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
        """The namespace ``doc`` describes (:meth:`to_dict`'s shape); ValueError if it is not
        a valid one."""
        if not isinstance(doc, dict) or "name" not in doc or "block_bytes" not in doc:
            raise ValueError("a namespace needs at least 'name' and 'block_bytes'")
        layout = doc.get("layout") or {}
        if not isinstance(layout, dict) or not set(layout) <= set(Layout.__dataclass_fields__):
            raise ValueError("layout must be a map of the Layout fields")
        return cls(
            name=doc["name"],
            block_bytes=doc["block_bytes"],
            layout=Layout(**layout),
            hash_algo=doc.get("hash_algo", "sha256"),
            hash_seed=doc.get("hash_seed"),
            tenant=doc.get("tenant"),
        )


def store_name(tenant: str | None, name: str) -> str:
    """The store's name of ``tenant``'s namespace ``name`` (``name`` itself for the admin's):
    ``tenant~name``. Raises ``ValueError`` for a name or tenant that is not a valid one."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError("namespace name must be 1-128 characters of letters, digits and "
                         f"._:@+=- starting with a letter or digit, got {name!r}")
    if tenant is None:
        return name
    return f"{check_tenant_name(tenant)}{TENANT_SEP}{name}"


def check_tenant_name(tenant: str) -> str:
    """``tenant`` if it may name a tenant (it becomes part of its namespaces' store names);
    else ``ValueError``."""
    if not isinstance(tenant, str) or not _NAME_RE.match(tenant):
        raise ValueError(f"tenant name {tenant!r:.140} must be 1-{MAX_TENANT_CHARS} "
                         "characters of letters, digits and ._:@+=- starting with a letter "
                         "or digit")
    return tenant


def differences(mine: dict[str, Any], theirs: dict[str, Any],
                labels: tuple[str, str]) -> list[str]:
    """``field (mine <label>, theirs <label>)`` for each field of two namespace definitions
    (:meth:`Namespace.to_dict`) that differs; a layout's fields each by name
    (``layout.block_size (16 registered, 32 requested)``)."""
    out = []
    for field_name in sorted(set(mine) | set(theirs)):
        a, b = mine.get(field_name), theirs.get(field_name)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{field_name}.{d}" for d in differences(a, b, labels)]
        elif a != b:
            out.append(f"{field_name} ({a!r} {labels[0]}, {b!r} {labels[1]})")
    return out


def _definition(ns: Namespace) -> dict[str, Any]:
    """What must match for a registration to be accepted (:meth:`Namespace.identity`)."""
    doc = ns.to_dict()
    return {k: doc[k] for k in ("block_bytes", "layout", "hash_algo", "hash_seed")}


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
            diffs = differences(_definition(have), _definition(ns), ("registered", "requested"))
            raise NamespaceConflictError(
                f"namespace {ns.name!r} already exists with a different definition: "
                + ", ".join(diffs))
        return False

    def remove(self, name: str) -> Namespace:
        """Forget ``name``; raises :class:`UnknownNamespaceError` if it is not registered."""
        try:
            return self._by_name.pop(name)
        except KeyError:
            raise UnknownNamespaceError(f"unknown namespace {name!r}") from None

    def get(self, name: str) -> Namespace:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownNamespaceError(f"unknown namespace {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def all(self) -> list[Namespace]:
        return list(self._by_name.values())


def _check_extra(extra: Any) -> None:
    """``layout.extra``: a map of JSON values, at most :data:`MAX_EXTRA_DEPTH` deep and
    :data:`MAX_EXTRA_BYTES` as JSON. Walked without recursion and with a node budget, so that
    a hostile value costs little before it is refused."""
    if not isinstance(extra, dict):
        raise ValueError("layout.extra must be a map")
    todo: list[tuple[Any, int]] = [(extra, 1)]
    nodes = 0
    while todo:
        value, depth = todo.pop()
        nodes += 1
        if depth > MAX_EXTRA_DEPTH:
            raise ValueError(f"layout.extra is nested deeper than {MAX_EXTRA_DEPTH} levels")
        if nodes > MAX_EXTRA_BYTES:  # every node is at least one byte of JSON
            raise ValueError(f"layout.extra is over {MAX_EXTRA_BYTES} bytes as JSON")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError("layout.extra's maps must have string keys")
                todo.append((item, depth + 1))
        elif isinstance(value, list):
            todo.extend((item, depth + 1) for item in value)
        elif value is not None and not isinstance(value, str | int | float):
            raise ValueError(f"layout.extra holds a {type(value).__name__}; only JSON values "
                             "(maps, lists, strings, numbers, booleans, null) are allowed")
    try:
        size = len(json.dumps(extra, separators=(",", ":"), allow_nan=False).encode())
    except ValueError as exc:
        raise ValueError(f"layout.extra is not valid JSON: {exc}") from None
    if size > MAX_EXTRA_BYTES:
        raise ValueError(f"layout.extra is {size} bytes as JSON, over {MAX_EXTRA_BYTES}")


class Registered(NamedTuple):
    """What registering a namespace did: the namespace as the server holds it (under the name
    its caller uses), whether this call created it, and the name the store (and a cluster's
    block index) knows it by: ``tenant~name`` for a tenant's, else the name itself ("" from a
    server too old to say)."""

    namespace: Namespace
    created: bool
    store_name: str = ""
