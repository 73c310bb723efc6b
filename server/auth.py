"""Bearer tokens and tenants, shared by both planes.

The admin token (``token``) sees every namespace. Each tenant token (``tenant_tokens``) sees
only namespaces registered with its tenant, and namespaces it registers are bound to it (under
names scoped to it: :mod:`server.tenant_view`). With no token configured every caller is admin
(the server then refuses to bind beyond loopback).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from kvstore.namespace import Namespace
from server.errors import AuthError, ForbiddenError
from server.settings import ServerSettings


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the admin (``tenant`` None) or one tenant."""

    tenant: str | None

    @property
    def admin(self) -> bool:
        return self.tenant is None

    def can_access(self, ns: Namespace) -> bool:
        return self.admin or ns.tenant == self.tenant

    def tenant_for_new(self, requested: str | None) -> str | None:
        """The tenant a namespace registered by this principal is bound to."""
        if self.admin:
            return requested
        if requested is not None and requested != self.tenant:
            raise ForbiddenError(f"a token of tenant {self.tenant!r} cannot register for "
                                 f"tenant {requested!r}")
        return self.tenant


ADMIN = Principal(tenant=None)


class Authenticator:
    """Turns a presented token into a :class:`Principal` (constant-time comparisons)."""

    def __init__(self, settings: ServerSettings) -> None:
        self._admin = settings.token.get_secret_value() if settings.token else None
        # the nodes of a cluster read each other's blocks as the admin would
        self._cluster = settings.cluster_token.get_secret_value() \
            if settings.cluster_token else None
        self._tenants = [(t, s.get_secret_value()) for t, s in settings.tenant_tokens.items()]
        self.enabled = settings.auth_enabled()

    def authenticate(self, token: str | None) -> Principal:
        """Raises :class:`AuthError` for a missing or unknown token when auth is enabled."""
        if not self.enabled:
            return ADMIN
        if not token:
            raise AuthError("missing bearer token")
        presented = token.encode()
        found: Principal | None = None
        if self._admin is not None and hmac.compare_digest(presented, self._admin.encode()):
            found = ADMIN
        if self._cluster is not None and hmac.compare_digest(presented, self._cluster.encode()):
            found = ADMIN
        for tenant, secret in self._tenants:  # no early exit: timing does not leak which
            if hmac.compare_digest(presented, secret.encode()) and found is None:
                found = Principal(tenant=tenant)
        if found is None:
            raise AuthError("invalid bearer token")
        return found
