"""Redis URLs as a node shows and accepts them: a password never shown, a scheme redis-py
takes. Free of redis-py, so that a node alone (and any command) never loads it."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def check_url(url: str) -> str:
    """``url`` if redis-py can use it; ValueError naming the problem otherwise."""
    scheme = urlsplit(url).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"cluster URL {masked(url)!r} must start with redis://, rediss:// or "
                         "unix://")
    return url
