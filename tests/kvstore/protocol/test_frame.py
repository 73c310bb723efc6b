"""Frame codec and argument readers (no server needed)."""

from __future__ import annotations

import msgpack
import pytest

from kvstore.protocol.fields import arg_hashes, arg_sizes
from kvstore.protocol.frame import (
    PREFIX,
    FrameError,
    decode_header,
    decode_prefix,
    encode_frame,
    split_payload,
)


def test_roundtrip_keeps_payload_out_of_msgpack() -> None:
    blocks = [b"a" * 10, bytearray(b"b" * 5)]
    pieces = encode_frame({"op": "put", "hashes": [b"x"]}, blocks)
    assert pieces[1] is blocks[0] and pieces[2] is blocks[1]  # no copies
    head = pieces[0]
    hlen, plen = PREFIX.unpack(head[:8])
    assert plen == 15 and hlen == len(head) - 8
    assert decode_header(head[8:]) == {"op": "put", "hashes": [b"x"]}
    views = split_payload(memoryview(b"".join(bytes(p) for p in pieces[1:])), [10, 5])
    assert [bytes(v) for v in views] == [b"a" * 10, b"b" * 5]


def test_prefix_limits_are_fatal() -> None:
    with pytest.raises(FrameError) as e:
        decode_prefix(PREFIX.pack(100, 0), max_header=99, max_payload=10)
    assert e.value.fatal and e.value.code == "too_large"
    with pytest.raises(FrameError) as e:
        decode_prefix(PREFIX.pack(1, 11), max_header=99, max_payload=10)
    assert e.value.fatal
    with pytest.raises(FrameError) as e:
        decode_prefix(PREFIX.pack(0, 0), max_header=99, max_payload=10)
    assert e.value.fatal and e.value.code == "bad_frame"
    assert decode_prefix(PREFIX.pack(99, 10), max_header=99, max_payload=10) == (99, 10)


@pytest.mark.parametrize("raw", [b"\xc1", b"\x92\x01", msgpack.packb([1, 2]),
                                 msgpack.packb({1: 2}), b"\xa3ab", msgpack.packb("x")])
def test_bad_headers_are_not_fatal_errors(raw: bytes) -> None:
    with pytest.raises(FrameError) as e:
        decode_header(raw)
    assert e.value.code == "bad_frame" and not e.value.fatal


def test_arg_readers_name_the_field() -> None:
    assert arg_hashes({"hashes": [b"a" * 32]}, 10) == [b"a" * 32]
    for bad in ({"hashes": "x"}, {"hashes": ["ab"]}, {"hashes": [b""]}, {"hashes": [b"x" * 65]},
                {}):
        with pytest.raises(FrameError, match="hashes"):
            arg_hashes(bad, 10)
    with pytest.raises(FrameError) as e:
        arg_hashes({"hashes": [b"a"] * 11}, 10)
    assert e.value.code == "too_large"
    assert arg_sizes({"sizes": [1, 2]}, 2, 3) == [1, 2]
    for bad in ({"sizes": [1]}, {"sizes": [1, -1]}, {"sizes": [1, 1]}, {"sizes": [1, True]}):
        with pytest.raises(FrameError, match="sizes"):
            arg_sizes(bad, 2, 3)
