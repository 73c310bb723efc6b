"""How a client turns ``/v1/info`` (:class:`kvstore.protocol.info.ServerInfo`, the type the
server answers with) into its route: the Unix socket and the slab on this host, TCP
elsewhere, and one clear error for an answer that is not a server's info."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.client.discovery import host_id, parse_info
from kvstore.client.errors import KVStoreUnavailableError, ProtocolError
from kvstore.protocol.info import ServerInfo, ShmInfo

URL = "http://10.0.0.7:8470"


def _info(**changes: Any) -> dict[str, Any]:
    info = ServerInfo(
        version="1", protocol=1, instance="i1", host_id=host_id(), data_port=8471,
        unix_socket=None, shm=ShmInfo(name=None, size=1 << 20, slot_bytes=4096, gen_offset=8),
        auth_required=False, max_frame_bytes=1 << 20, max_header_bytes=1 << 16, max_batch=64,
        max_lease_s=30.0)
    return info.model_copy(update=changes).model_dump(mode="json")


def test_this_host_with_its_socket_takes_the_socket_and_the_slab(tmp_path: Any) -> None:
    sock = tmp_path / "kv.sock"
    sock.touch()
    route = parse_info(URL, _info(unix_socket=str(sock)))
    assert route.target == str(sock) and route.local and route.shm_offered
    assert (route.shm_size, route.shm_slot_bytes, route.shm_gen_offset) == (1 << 20, 4096, 8)
    assert route.max_lease_s == 30.0


def test_another_host_or_tcp_takes_the_data_port_without_the_slab() -> None:
    for route in (parse_info(URL, _info(host_id="elsewhere")),
                  parse_info(URL, _info(), transport="tcp")):
        assert route.target == ("10.0.0.7", 8471) and not route.local
        assert not route.shm_offered and route.shm_name is None
    with pytest.raises(KVStoreUnavailableError, match="no reachable data plane"):
        parse_info(URL, _info(host_id="elsewhere", data_port=None))


@pytest.mark.parametrize("doc", [{"instance": "i1"}, [], {**_info(), "max_batch": "many"}])
def test_an_answer_that_is_not_a_servers_info_is_one_protocol_error(doc: Any) -> None:
    with pytest.raises(ProtocolError, match=r"unexpected /v1/info answer: \S") as err:
        parse_info(URL, doc)
    assert "\n" not in str(err.value)
