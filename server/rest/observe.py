"""Request counters and latencies of the REST plane, as a pure ASGI middleware.

Starlette's ``@app.middleware("http")`` (``BaseHTTPMiddleware``) runs the route in a task
group and passes every response message through a memory stream: on a 2 MiB block GET that
cost more than the route itself. Here the status is read off the ``http.response.start``
message as it goes by, and the route (which the router records in the scope) once the
response is done.
"""

from __future__ import annotations

import time
from typing import Any

from server.metrics import ServerMetrics


class ObserveMiddleware:
    """Counts each HTTP request by route and status and times it (``metrics.observe``)."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an exception that escapes every handler becomes a 500 further out

        async def send_seen(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_seen)
        finally:
            op = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.observe("rest", op, str(status), time.perf_counter() - start)
