"""``GET /dashboard``: a live page of the server's stats (hit rate over time per tier and per
namespace, occupancy and evictions per tier, bytes in and out, pinned bytes, S3 health), drawn
in the browser as plain SVG from polls of ``/v1/stats`` and ``/healthz``, with the server's
version, ports and data dir from ``/v1/info``.

The page and its assets (``server/dashboard/``, package data) are public: they hold no
data, and a browser cannot send a bearer header when it opens a page. The data comes from the
polls, which carry the token (typed into the page, or given as ``#token=...`` in the address)
and follow ``/v1/stats``' rules: the admin sees everything, a tenant its own namespaces. Every
byte is served from here (a Content-Security-Policy of ``'self'`` forbids anything else).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter(tags=["dashboard"], include_in_schema=False)

ASSETS = {
    "/dashboard": ("index.html", "text/html; charset=utf-8"),
    "/dashboard/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "/dashboard/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
PATHS = frozenset(ASSETS)
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
                               "form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@cache
def _asset(name: str) -> bytes:
    return (resources.files("server") / "dashboard" / name).read_bytes()


def _route(path: str, name: str, media_type: str) -> None:
    @router.get(path, response_class=Response)
    def serve() -> Response:
        return Response(_asset(name), media_type=media_type, headers=HEADERS)


for _path, (_name, _type) in ASSETS.items():
    _route(_path, _name, _type)
