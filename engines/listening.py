"""How a worker and the router serve their HTTP app, and say where once they listen.

uvicorn runs on the sockets the command bound before it loaded anything
(:func:`kvstore.cli_kit.bind_tcp`); once it listens on them, one line goes to stderr whatever
the log level: ``kvstore-engine worker listening on http://127.0.0.1:8480 (model ./tiny-llama,
...)``. The line comes after uvicorn's startup (the app's lifespan included), so a reader who
sees it can connect; a start that fails before then never prints it.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import uvicorn


def url_of(socks: list[socket.socket]) -> str:
    """The ``http://`` URL of the first bound socket (an IPv6 address in brackets)."""
    host, port = socks[0].getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def count(n: int, noun: str) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


class _Announcing(uvicorn.Server):
    """uvicorn that prints ``line`` once it has started listening."""

    def __init__(self, config: uvicorn.Config, line: str) -> None:
        super().__init__(config)
        self.line = line

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            print(self.line, file=sys.stderr, flush=True)


def serve(app: Any, socks: list[socket.socket], log_level: str, what: str,
          details: str) -> None:
    """Run ``app`` on ``socks`` until SIGTERM or SIGINT; once it listens, print
    ``<what> listening on <URL> (<details>)`` to stderr."""
    line = f"{what} listening on {url_of(socks)} ({details})"
    _Announcing(uvicorn.Config(app, log_level=log_level), line).run(sockets=socks)
