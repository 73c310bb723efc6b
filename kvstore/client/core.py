"""The sans-I/O core that both client faces share: who the client is, which server it is
talking to, and the rules for connecting, rediscovering and retrying.

The core never touches a socket. It keeps the client's identity (URL, token, ``owner`` id),
the discovered :class:`~kvstore.client.discovery.Route` and the slab mapping that goes
with it, and the put/get planner (:class:`~kvstore.client.transfer.Transfers`). A face
(:class:`~kvstore.client.sync_client.KVStoreClient` over blocking sockets,
:class:`~kvstore.client.async_client.AsyncKVStoreClient` over asyncio streams) fetches
``/v1/info`` with its own HTTP client and hands the response to :meth:`ClientCore.adopt`, runs
:meth:`ClientCore.hello` on each new connection, and asks :meth:`ClientCore.retryable` whether
an error means "reconnect and run the call once more".
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from kvstore.client.discovery import Route, auth_headers, check_response, info_url, parse_info
from kvstore.client.errors import KVStoreClientError, KVStoreUnavailableError, ProtocolError
from kvstore.client.exchange import Call, Link, Steps
from kvstore.client.shm import SlabMapping, remap
from kvstore.client.transfer import Transfers
from kvstore.protocol import Hello, HelloReply


class ClientCore:
    """The state of one client, shared by its connections (thread-safe)."""

    def __init__(self, url: str, token: str | None, *, use_shm: bool | None, timeout: float,
                 transport: str, owner: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.use_shm = use_shm
        self.timeout = timeout
        self.transport = transport
        # pins, reservations and grants of all our connections are held under this id; a
        # client given the id of one it replaces can still release what that one held
        self.owner = owner or uuid.uuid4().hex
        self.info: Route | None = None  # None: (re)discover before the next connect
        self.slab: SlabMapping | None = None
        self.transfers = Transfers()
        self._lock = threading.Lock()

    # -- discovery ------------------------------------------------------------------------
    @property
    def info_url(self) -> str:
        return info_url(self.url)

    @property
    def info_headers(self) -> dict[str, str]:
        return auth_headers(self.token)

    def cannot_reach(self, exc: Exception) -> KVStoreUnavailableError:
        """The error for a ``/v1/info`` request that got no answer."""
        return KVStoreUnavailableError(f"cannot reach kvstore at {self.url}: {exc}")

    def adopt(self, status: int, text: str, json: Callable[[], Any]) -> Route:
        """Take the answer to ``/v1/info`` (``json()`` parses its body): the server to talk
        to from now on, with its slab mapped (the previous mapping dropped). Raises on an
        error answer."""
        check_response(status, text, self.url)
        info = parse_info(self.url, json(), self.transport)
        with self._lock:
            old, self.slab = self.slab, None
            self.slab = remap(old, info, self.use_shm, self.url, self.token, self.timeout)
            self.info = info
        return info

    def link(self, info: Route) -> Link:
        """What a call on a connection to ``info`` runs with."""
        return Link(info, self.slab)

    def hello(self, info: Route) -> Steps[bool]:
        """The first frame of a connection; whether it reached the server instance ``info``
        describes (False: it restarted since, rediscover)."""
        header, _ = yield Call(Hello(self.token, self.owner))
        return HelloReply.from_header(header).instance == info.instance

    # -- failures -------------------------------------------------------------------------
    @staticmethod
    def retryable(exc: BaseException) -> bool:
        """Whether ``exc`` means the connection broke (reconnect and retry once), rather than
        an answer from the server (raised as it is)."""
        return not isinstance(exc, KVStoreClientError) or isinstance(
            exc, KVStoreUnavailableError | ProtocolError)

    def unavailable(self, exc: BaseException) -> KVStoreUnavailableError:
        """The error once the retry failed too (named once: a message that already names the
        server is kept as it is)."""
        text = str(exc) or repr(exc)
        if self.url in text:
            return KVStoreUnavailableError(text)
        return KVStoreUnavailableError(f"kvstore at {self.url}: {text}")

    def close(self) -> None:
        with self._lock:
            if self.slab is not None:
                self.slab.close()
                self.slab = None
