"""Field types shared by the REST bodies: names, hex hashes, counts and strict integers, with
the patterns and batch limit the OpenAPI document states for them."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from kvstore.protocol.stats import Count  # noqa: F401 - the REST schemas take it from here

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$"
# a name in a request: a plain one, or (the admin's way to name a tenant's) tenant~name
REF_PATTERN = (r"^(?:[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}~)?"
               r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$")
HEX_PATTERN = r"^(?:[0-9a-fA-F]{2}){1,64}$"
MAX_BATCH = 65536  # hashes per request; the server may configure less


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    return value


Int = Annotated[int, BeforeValidator(_no_bool)]  # JSON true is not 1 here
HexHash = Annotated[str, Field(pattern=HEX_PATTERN, description="block hash, 1-64 bytes as hex")]
NamespaceName = Annotated[str, Field(pattern=NAME_PATTERN, description="namespace name")]
NamespaceRef = Annotated[str, Field(pattern=REF_PATTERN, description="namespace name (the "
                                    "admin names a tenant's as tenant~name)")]
