"""The async client's connection: frames over an asyncio stream (TCP or Unix socket)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstore.client.discovery import Route
from kvstore.client.errors import KVStoreUnavailableError, ProtocolError, from_reply
from kvstore.client.landed import landed, reply_sums
from kvstore.client.summed import frame_groups
from kvstore.protocol.frame import PREFIX, PREFIX_BYTES, Buffer, decode_header

if TYPE_CHECKING:
    from kvstore.client.exchange import Answer, Call


class AsyncConn:
    """One connection to the data plane: a frame out, its reply back, in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 info: Route) -> None:
        self.reader, self.writer, self.info = reader, writer, info
        self._next_id = 1

    @property
    def instance(self) -> str:
        return self.info.instance

    @classmethod
    async def open(cls, info: Route, timeout: float) -> AsyncConn:
        try:
            if isinstance(info.target, str):
                coro = asyncio.open_unix_connection(info.target)
            else:
                coro = asyncio.open_connection(*info.target)
            reader, writer = await asyncio.wait_for(coro, timeout)
        except (OSError, TimeoutError) as exc:
            raise KVStoreUnavailableError(f"cannot connect to {info.target}: {exc}") from exc
        return cls(reader, writer, info)

    async def call(self, call: Call, timeout: float) -> Answer:
        """Send one planned request (see :mod:`kvstore.client.exchange`); its answer, with
        the blocks of a get copied into ``call.into`` when it is given."""
        reply, blocks = await self.request(call.header(), call.payload, timeout=timeout)
        if call.into is None:
            return reply, blocks
        return reply, [copy_into(b, dest) for b, dest in zip(blocks, call.into, strict=False)]

    async def request(self, header: dict[str, Any], payload: Sequence[Buffer] = (),
                      timeout: float = 10.0) -> tuple[dict[str, Any], list[bytes | None]]:
        rid = self._next_id
        self._next_id += 1
        for group in frame_groups({**header, "id": rid}, payload):
            self.writer.writelines(group)
        await asyncio.wait_for(self.writer.drain(), timeout)
        if header.get("noreply"):
            return {}, []
        return await asyncio.wait_for(self._reply(rid), timeout)

    async def _reply(self, rid: int) -> tuple[dict[str, Any], list[bytes | None]]:
        header_len, payload_len = PREFIX.unpack(await self.reader.readexactly(PREFIX_BYTES))
        reply = decode_header(await self.reader.readexactly(header_len))
        sizes = reply.get("sizes")
        blocks: list[bytes | None] = []
        if isinstance(sizes, list) and sum(s for s in sizes if s > 0) == payload_len:
            sums = reply_sums(reply, len(sizes))
            for i, size in enumerate(sizes):
                block = None if size < 0 else await self.reader.readexactly(size)
                blocks.append(block if landed(sums, i, block) else None)
        elif payload_len:
            await self.reader.readexactly(payload_len)
            raise ProtocolError("reply payload without matching sizes")
        if not reply.get("ok"):
            raise from_reply(reply)
        if reply.get("id") != rid:
            raise ProtocolError(f"reply id {reply.get('id')} does not match request {rid}")
        return reply, blocks

    def close(self) -> None:
        self.writer.close()


def copy_into(block: bytes | None, dest: Buffer) -> bool:
    """Copy ``block`` into the writable ``dest``; False for a miss (None)."""
    if block is None:
        return False
    memoryview(dest).cast("B")[:len(block)] = block
    return True
