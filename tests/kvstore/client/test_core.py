"""The client's sans-I/O core without a server: each call's steps are fed scripted replies,
so what the clients send, and how they clean up after a failure, is checked frame by frame."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.checksum import checksum
from kvstore.client import calls, grant
from kvstore.client.core import ClientCore
from kvstore.client.discovery import Route
from kvstore.client.errors import BlockSizeError, CapacityError, StaleStagingError
from kvstore.client.exchange import Answer, Call, Exchange, Link, run_blocking
from kvstore.client.transfer import Transfers
from kvstore.protocol import (
    Check,
    Get,
    Hello,
    Lookup,
    Pin,
    Put,
    ShmAbort,
    ShmAcquire,
    ShmCommit,
    ShmLookup,
    ShmPut,
    ShmRelease,
    ShmReserve,
    ShmStage,
)
from kvstore.protocol.info import ServerInfo
from kvstore.types import BlockHash, PutResult

INFO = Route("inst", True, "/sock", "slab", 64 << 20, max_frame_bytes=8 << 20, max_batch=3)
H = [BlockHash(bytes([i]) * 32) for i in range(4)]


def link(slab: Any = None) -> Link:
    return Link(INFO, slab)


class FakeSlab:
    """A slab of 1 KiB in a bytearray; ``fail_writes`` makes every write raise."""

    def __init__(self, fail_writes: bool = False) -> None:
        self.buf = bytearray(1024)
        self.fail_writes = fail_writes

    def write(self, extents: Any, block: Any) -> int:
        if self.fail_writes:
            raise BlockSizeError("wrong size", "block_size")
        (off, n), = extents
        self.buf[off:off + n] = block
        return checksum(block)

    def read(self, extents: Any) -> bytes:
        (off, n), = extents
        return bytes(self.buf[off:off + n])

    def read_into(self, extents: Any, dest: Any) -> int:
        (off, n), = extents
        memoryview(dest)[:n] = self.buf[off:off + n]
        return n


class Script:
    """A fake server: answers each call from a list of replies (an exception is raised at
    the send), and records what was sent."""

    def __init__(self, *replies: Answer | BaseException) -> None:
        self.replies = list(replies)
        self.sent: list[Call] = []

    def __call__(self, call: Call) -> Answer:
        self.sent.append(call)
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    @property
    def requests(self) -> list[Any]:
        return [c.request for c in self.sent]


def test_put_without_the_slab_sends_batches_of_put_frames() -> None:
    server = Script(({"stored": 3, "existing": 0, "refused": 0}, []),
                    ({"stored": 0, "existing": 1, "refused": 0}, []))
    blocks = [b"a" * 4] * 4
    result = run_blocking(Transfers().put(link(), "ns", H, blocks, False), server)
    assert result == PutResult(3, 1, 0)
    csum = checksum(b"a" * 4)  # every put carries the writer's checksums
    assert server.requests == [Put("ns", H[:3], [4, 4, 4], sums=[csum] * 3),
                               Put("ns", H[3:], [4], sums=[csum])]
    assert list(server.sent[0].payload) == blocks[:3]


def test_a_durable_put_never_uses_the_slab() -> None:
    server = Script(({"stored": 1, "existing": 0, "refused": 0}, []))
    run_blocking(Transfers().put(link(FakeSlab()), "ns", H[:1], [b"x"], True),
                 server)
    assert server.requests == [Put("ns", H[:1], [1], durable=True, sums=[checksum(b"x")])]


def test_local_put_stages_then_puts_in_one_round_trip_after() -> None:
    slab, transfers = FakeSlab(), Transfers()
    to = link(slab)
    places = [[[0, 4]], [[4, 4]]]
    server = Script(({"staged": places}, []),
                    ({"stored": 2, "existing": 0, "refused": 0, "used": [0, 4],
                      "staged": [[[8, 4]], [[12, 4]]]}, []),
                    ({"stored": 2, "existing": 0, "refused": 0, "used": [8, 12],
                      "staged": []}, []))
    assert run_blocking(transfers.put(to, "ns", H[:2], [b"aaaa", b"bbbb"], False),
                        server).stored == 2
    sums = [checksum(b) for b in (b"aaaa", b"bbbb", b"cccc", b"dddd")]
    assert server.requests == [ShmStage("ns", 2), ShmPut("ns", H[:2], [0, 4], sums=sums[:2])]
    assert bytes(slab.buf[:8]) == b"aaaabbbb"
    run_blocking(transfers.put(to, "ns", H[2:], [b"cccc", b"dddd"], False), server)
    assert server.requests[2] == ShmPut("ns", H[2:], [8, 12], sums=sums[2:])  # pooled
    assert bytes(slab.buf[8:16]) == b"ccccdddd"


def test_stale_staged_places_fall_back_to_reserve_and_commit() -> None:
    slab, transfers = FakeSlab(), Transfers()
    server = Script(({"staged": [[[0, 4]]]}, []), StaleStagingError("gone", "stale_staging"),
                    ({"extents": [[[16, 4]]]}, []),
                    ({"stored": 1, "existing": 0, "refused": 0}, []))
    result = run_blocking(transfers.put(link(slab), "ns", H[:1], [b"zzzz"], False),
                          server)
    assert result == PutResult(1, 0, 0)
    csum = [checksum(b"zzzz")]
    assert server.requests[1:] == [ShmPut("ns", H[:1], [0], sums=csum),
                                   ShmReserve("ns", H[:1]), ShmCommit("ns", H[:1], sums=csum)]
    assert transfers.staged.held("ns") == 0 and bytes(slab.buf[16:20]) == b"zzzz"


def test_a_failed_copy_aborts_the_reservation_and_raises() -> None:
    transfers = Transfers()
    server = Script(({"staged": []}, []),  # the server stages too few places: reserve
                    ({"extents": [[[0, 4]]]}, []), ({"aborted": 1}, []))
    with pytest.raises(BlockSizeError):
        run_blocking(transfers.put(link(FakeSlab(fail_writes=True)), "ns", H[:1],
                                   [b"zzzz"], False), server)
    assert server.requests == [ShmStage("ns", 1), ShmReserve("ns", H[:1]), ShmAbort("ns", H[:1])]


def test_local_get_copies_out_and_releases_without_a_reply() -> None:
    slab = FakeSlab()
    slab.buf[0:4] = b"abcd"
    server = Script(({"extents": [[[0, 4]], None]}, []), ({}, []))
    out = run_blocking(Transfers().get(link(slab), "ns", H[:2], None), server)
    assert out == [b"abcd", None]
    assert server.requests == [ShmAcquire("ns", H[:2]), ShmRelease("ns", H[:2])]
    assert server.sent[1].noreply and "noreply" in server.sent[1].header()


def test_a_full_host_tier_sends_the_get_over_the_socket() -> None:
    dest = [bytearray(4)]
    server = Script(CapacityError("full", "capacity"), ({"sizes": [4]}, [True]))
    out = run_blocking(Transfers().get(link(FakeSlab()), "ns", H[:1], dest), server)
    assert out == [True]
    assert server.requests == [ShmAcquire("ns", H[:1]), Get("ns", H[:1], checked=True)]
    assert server.sent[1].into == dest


def test_a_socket_get_reports_the_blocks_that_failed_as_they_landed() -> None:
    # the connection hashed each block as it landed: the second one (sent, with a checksum)
    # arrived as a miss, the third was a miss on the server, the first was good
    server = Script(({"sizes": [4, 4, -1], "sums": [1, 2, None]}, [b"good", None, None]),
                    ({}, []))
    out = run_blocking(Transfers().get(link(), "ns", H[:3], None), server)
    assert out == [b"good", None, None]
    assert server.requests == [Get("ns", H[:3], checked=True), Check("ns", H[1:2])]
    assert server.sent[1].noreply


def test_small_calls_build_their_message_and_read_their_reply() -> None:
    to = link()
    server = Script(({"prefix_blocks": 1, "tiers": ["host"]}, []), ({}, []))
    assert run_blocking(calls.lookup(to, "ns", H[:2]), server) == (1, ["host"])
    assert run_blocking(calls.pin(to, "ns", H[:1], 5.0, False), server) == []
    assert server.requests == [Lookup("ns", H[:2]), Pin("ns", H[:1], 5.0)]
    assert server.sent[1].noreply


def test_a_grant_without_the_slab_is_a_plain_lookup() -> None:
    server = Script(({"prefix_blocks": 2, "tiers": ["host", "disk"]}, []))
    g = run_blocking(grant.lookup_acquire(link(), "ns", H[:3], 4.0), server)
    assert (g.prefix_blocks, g.extents, g.instance) == (2, [None, None], "")
    server = Script(({"prefix_blocks": 1, "tiers": ["host"], "extents": [[[0, 4]]]}, []))
    g = run_blocking(grant.lookup_acquire(link(FakeSlab()), "ns", H[:3], 4.0), server)
    assert server.requests == [ShmLookup("ns", H[:3], 4.0)]
    assert (g.instance, g.granted(H[:3])) == ("inst", H[:1])


def test_hello_checks_the_server_instance() -> None:
    core = ClientCore("http://h:1/", "tok", use_shm=None, timeout=1.0, transport="auto",
                      owner="me")
    def hello(instance: str) -> dict[str, Any]:  # the server's info beside the owner
        info = ServerInfo(version="1", protocol=1, instance=instance, host_id="h",
                          data_port=None, unix_socket="/sock", shm=None, auth_required=True,
                          max_frame_bytes=8 << 20, max_header_bytes=1 << 16, max_batch=3)
        return {**info.model_dump(), "owner": "*/me"}

    server = Script((hello("inst"), []), (hello("other"), []))
    assert run_blocking(core.hello(INFO), server) is True
    assert run_blocking(core.hello(INFO), server) is False
    assert server.requests[0] == Hello("tok", "me")


def test_exchange_raises_what_the_steps_do_not_handle() -> None:
    ex = Exchange(calls.stats(link()))
    assert ex.call is not None
    with pytest.raises(ConnectionResetError):
        ex.fail(ConnectionResetError("gone"))


def test_an_unreachable_server_is_named_once_in_the_error() -> None:
    from kvstore.client import KVStoreClient
    from kvstore.client.errors import KVStoreUnavailableError
    from kvstore.testing.proc import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with KVStoreClient(url, timeout=2.0) as client, \
            pytest.raises(KVStoreUnavailableError) as err:
        client.lookup("ns", H)
    assert str(err.value).count(url) == 1, str(err.value)


def test_a_server_that_never_answers_is_a_timeout_that_says_so() -> None:
    """The data plane socket waits with kernel timeouts, which end in EAGAIN ("Resource
    temporarily unavailable"); the client says what happened instead."""
    import socket

    from kvstore.client.socket_conn import FrameSocket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        conn = FrameSocket.connect(listener.getsockname()[:2], 0.3)
        try:
            with pytest.raises(TimeoutError, match=r"no answer .* within 0.3 s"):
                conn.request({"op": "stats"})
        finally:
            conn.close()
