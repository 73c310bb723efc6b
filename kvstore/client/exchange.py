"""The sans-I/O seam between the client core and its two faces: a call is planned as a
generator of :class:`Call` s, and a face runs it over its own connection.

A *steps* generator yields each request it needs sent and receives the reply (the header
and the payload's blocks), or has the send's exception raised at the ``yield`` so that it
can clean up (abort a reservation, release pins) and re-raise. :class:`Exchange` holds one
such generator; the sync face feeds it replies from a blocking socket (:func:`run_blocking`),
the asyncio face awaits them from a stream. Neither face knows what the steps do.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from kvstore.protocol import Buffer, Header, Request

if TYPE_CHECKING:
    from kvstore.client.discovery import Route
    from kvstore.client.shm import SlabMapping

T = TypeVar("T")
Answer = tuple[Header, list[Any]]
"""A reply: its header, and each payload block (bytes or None; with ``into``, True/False)."""
Steps = Generator["Call", Answer, T]


class Link(NamedTuple):
    """What a call's steps may know of the connection they run over: the server it reaches
    and this process's mapping of that server's slab (None: bytes go over the socket)."""

    info: Route
    slab: SlabMapping | None


@dataclass(slots=True)
class Call:
    """One request to send: the message, its payload and, for a get, where each block goes.
    With ``noreply`` the server sends no reply and the answer is empty."""

    request: Request
    payload: Sequence[Buffer] = ()
    into: Sequence[Buffer] | None = None
    noreply: bool = False

    def header(self) -> Header:
        header = self.request.to_header()
        if self.noreply:
            header["noreply"] = True
        return header


class Exchange(Generic[T]):
    """One run of a steps generator: :attr:`call` is the next request to send (None once the
    steps are done and :attr:`result` holds what they returned)."""

    __slots__ = ("_steps", "call", "result")

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self.call: Call | None = None
        self.result: T
        self._resume(steps.send, None)

    def answer(self, answer: Answer) -> None:
        """Hand the reply to :attr:`call` to the steps."""
        self._resume(self._steps.send, answer)

    def fail(self, exc: BaseException) -> None:
        """Raise the send's error in the steps; it comes back out if they do not handle it."""
        self._resume(self._steps.throw, exc)

    def feed(self, send: Callable[[Call], Answer]) -> None:
        """Send :attr:`call` with a blocking ``send`` and hand over its reply or error."""
        assert self.call is not None
        try:
            answer = send(self.call)
        except BaseException as exc:  # the steps may clean up; they re-raise what they can't
            self.fail(exc)
        else:
            self.answer(answer)

    def _resume(self, step: Callable[[Any], Call], value: Any) -> None:
        try:
            self.call = step(value)
        except StopIteration as done:
            self.call, self.result = None, done.value


def run_blocking(steps: Steps[T], send: Callable[[Call], Answer]) -> T:
    """Run ``steps`` to the end with a blocking ``send``; their result."""
    exchange = Exchange(steps)
    while exchange.call is not None:
        exchange.feed(send)
    return exchange.result
