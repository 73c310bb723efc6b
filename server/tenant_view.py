"""What one caller sees of the store: its namespaces under the names it gave them, and stats
over those only. Both planes go through here, so that they give a tenant the same view.

Names are scoped per tenant. The store holds tenant ``a``'s namespace ``chat`` as
``a~chat`` (:func:`kvstore.namespace.store_name`), so two tenants may both have ``chat``.
A tenant names its namespaces plainly, in requests and in every reply, listing and stats
row; it can never name another tenant's: such a name is unknown to it, with the same error
as a name nobody registered (no existence oracle). A tenant's namespace registered before
names were scoped (stored under its plain name) keeps that name, and its blocks.

The admin (and every caller when auth is off) names namespaces as the store does: its own
plainly, a tenant's as ``tenant~name``, and sees each with its tenant.

Tiers are shared by every tenant, so their counters and occupancy tell one tenant about the
others' traffic: a tenant's stats have no tiers, and its totals count only its own blocks and
requests (``capacity_bytes`` stays the store's, which is configuration, not activity).
The server's info leaves out its data dir for a tenant (a path on the operator's host).
"""

from __future__ import annotations

import dataclasses

from kvstore.errors import UnknownNamespaceError
from kvstore.namespace import TENANT_SEP, Namespace, store_name
from kvstore.protocol.health import StoreHealth
from kvstore.protocol.info import ServerInfo
from kvstore.protocol.stats import StoreStats, TotalStats
from kvstore.store import StoreAPI
from server.auth import Principal

SUMMED = ("queries", "hits", "misses", "evictions", "promotions", "demotions",
          "corrupt_dropped", "prefetched", "dropped", "stored", "bytes_in", "bytes_out",
          "blocks", "bytes")


def resolve(store: StoreAPI, principal: Principal, name: str) -> Namespace:
    """The namespace ``principal`` calls ``name`` (its ``name`` is the store's, for the store
    calls). Raises ``UnknownNamespaceError`` naming ``name``, the same for a name of another
    tenant's as for one nobody registered."""
    if principal.admin:
        return store.namespace(name)
    if TENANT_SEP not in name:  # a tenant's own names never hold it
        # scoped (the usual), or registered before names were (the registration of a name
        # finds that one first, so a tenant never has both)
        for candidate in (f"{principal.tenant}{TENANT_SEP}{name}", name):
            ns = _registered(store, candidate)
            if ns is not None and ns.tenant == principal.tenant:
                return ns
    raise UnknownNamespaceError(f"unknown namespace {name!r}")


def to_register(store: StoreAPI, principal: Principal, ns: Namespace,
                tenant: str | None) -> Namespace:
    """``ns`` (named as its registrant calls it) as the store is to hold it, bound to
    ``tenant`` (the tenant the request asked for, if any: only the admin may name one).
    Raises ``ForbiddenError`` for a tenant token asking for another tenant, ``ValueError``
    for a name or tenant that is not a valid one."""
    owner = principal.tenant_for_new(tenant)
    if owner is None:
        return dataclasses.replace(ns, tenant=None)
    scoped_before = _registered(store, ns.name)
    if scoped_before is not None and scoped_before.tenant == owner:
        return dataclasses.replace(ns, tenant=owner)  # the same namespace: same checks
    return dataclasses.replace(ns, name=store_name(owner, ns.name), tenant=owner)


def as_seen(principal: Principal, ns: Namespace) -> Namespace:
    """``ns`` as ``principal`` names it (the store's namespace, for the admin)."""
    if principal.admin or ns.name == ns.local_name:
        return ns
    return dataclasses.replace(ns, name=ns.local_name)


def shown_name(principal: Principal, name: str) -> str:
    """The store's namespace ``name`` as ``principal`` calls it."""
    return name if principal.admin else name.rpartition(TENANT_SEP)[2]


def visible(store: StoreAPI, principal: Principal) -> list[Namespace]:
    """The store's namespaces ``principal`` may use (store names)."""
    return [ns for ns in store.namespaces() if principal.can_access(ns)]


def visible_stats(store: StoreAPI, principal: Principal) -> StoreStats:
    """``store.stats()`` as ``principal`` may see it, under the names it calls them: a tenant
    gets its namespaces' rows, totals summed over them, and no tiers (the tiers' counters are
    every tenant's traffic)."""
    stats = store.stats()
    if principal.admin:
        return stats
    mine = {ns.name for ns in visible(store, principal)}
    namespaces = {shown_name(principal, k): v for k, v in stats.namespaces.items() if k in mine}
    rows = [row.model_dump(include=set(SUMMED)) for row in namespaces.values()]
    totals = TotalStats(**{key: sum(r[key] for r in rows) for key in SUMMED},
                        capacity_bytes=stats.totals.capacity_bytes)
    totals.hit_rate = totals.hits / totals.queries if totals.queries else 0.0
    return StoreStats(totals=totals, namespaces=namespaces)


def visible_health(health: StoreHealth, principal: Principal) -> StoreHealth:
    """The store's health as ``principal`` may see it: the admin all of it; a tenant whether
    the store and each tier are ok, nothing of the tiers' block counts, free slots, paths or
    damage (they hold every tenant's blocks)."""
    return health if principal.admin else health.only_ok()


def visible_info(info: ServerInfo, principal: Principal) -> ServerInfo:
    """The server's info as ``principal`` may see it: a tenant's has no ``data_dir``."""
    return info if principal.admin else info.model_copy(update={"data_dir": None})


def _registered(store: StoreAPI, name: str) -> Namespace | None:
    try:
        return store.namespace(name)
    except UnknownNamespaceError:
        return None
