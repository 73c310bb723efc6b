"""A request frame in groups of pieces to send in turn, and a put's checksums computed while
its blocks are being sent.

A put with ``trailer`` (:class:`~kvstore.protocol.Put`) does not hash its blocks before the
first byte moves: a worker thread hashes them while the face sends them in one scatter-gather
write (the send, and xxhash on inputs over 64 KiB, release the GIL), and their checksums go
last, in the trailer. The sender mostly waits for the server to take the bytes, so its core
has room for the hash (the asyncio face, whose writes do not block, hashes after handing the
blocks over). A checksum is of the caller's buffer, not of what the kernel took: a caller
that changes a block while it is being sent gets the block refused, never stored as other
bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from kvstore.checksum import checksums
from kvstore.protocol import SUM_BYTES, Buffer, Header, pack_sums
from kvstore.protocol.frame import PREFIX, encode_frame, pack_header

ALONGSIDE = 1 << 20  # payload bytes from which the blocks are hashed while they are sent


def frame_groups(header: Header, payload: Sequence[Buffer], *,
                 alongside: bool = False) -> Iterator[list[Buffer]]:
    """The pieces of one frame, in groups to send in order (each a ``sendmsg`` list); the
    face sends one group before it asks for the next. With ``alongside`` (a face whose send
    blocks until the kernel has the bytes) a large trailer put's blocks are hashed in a
    thread during the send; otherwise after they are handed to the face."""
    if not header.get("trailer"):
        yield encode_frame(header, payload)
        return
    head = pack_header(header)
    size = sum(memoryview(b).nbytes for b in payload)
    prefix = PREFIX.pack(len(head), size + SUM_BYTES * len(payload)) + head
    if size < ALONGSIDE:  # one write: the hash costs less than a second one
        yield [prefix, *payload, pack_sums(checksums(payload))]
        return
    if not alongside:
        yield [prefix, *payload]
        yield [pack_sums(checksums(payload))]
        return
    sums: list[int] = []
    worker = threading.Thread(target=lambda: sums.extend(checksums(payload)), daemon=True)
    worker.start()
    try:
        yield [prefix, *payload]
    finally:  # sent, or the send failed: the thread ends either way
        worker.join()
    yield [pack_sums(sums)]
