"""``/v1/blocks/{namespace}/{block_hash_hex}``: single-block PUT, GET and DELETE as
``application/octet-stream``, for tools and debugging (engines use the data plane)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from kvstore.checksum import checksum, checksum_parts
from kvstore.errors import CapacityError, ChecksumMismatchError
from kvstore.namespace import Namespace
from kvstore.store import StoreAPI
from kvstore.types import BlockHash
from server.auth import Principal
from server.dataplane.direct_get import DirectGet
from server.errors import BlockNotFoundError
from server.rest.deps import PrincipalDep, StoreDep, errors
from server.rest.schemas import HEX_PATTERN, REF_PATTERN, DeleteOut, PutOut
from server.rest.slab_body import SlabResponse
from server.tenant_view import resolve
from server.writes import durable_put

if TYPE_CHECKING:
    from server.peer_fill import PeerFill

router = APIRouter(prefix="/v1/blocks", tags=["blocks"])

NsPath = Annotated[str, Path(pattern=REF_PATTERN, description="namespace name (the admin "
                                                              "names a tenant's tenant~name)")]
HashPath = Annotated[str, Path(pattern=HEX_PATTERN, description="block hash as hex")]
_OCTETS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
CHECKSUM_HEADER = "X-KVStore-Checksum"  # xxh3-64 of the block's bytes, 16 hex digits
SumHeader = Annotated[str | None, Header(
    alias=CHECKSUM_HEADER, pattern="^[0-9a-fA-F]{16}$",
    description="xxh3-64 of the body as 16 hex digits: a body that differs is refused (400)")]


def _resolve(store: StoreAPI, principal: Principal, namespace: str,
             block_hash_hex: str) -> tuple[Namespace, BlockHash]:
    ns = resolve(store, principal, namespace)
    return ns, BlockHash(bytes.fromhex(block_hash_hex))


@router.put(
    "/{namespace}/{block_hash_hex}",
    status_code=201,
    response_model=PutOut,
    responses={200: {"model": PutOut, "description": "the block was already stored"},
               **errors(400, 401, 404, 413, 422, 503, 507)},
    openapi_extra={"requestBody": {"required": True, "content": _OCTETS}},
)
async def put_block(
    request: Request,
    response: Response,
    namespace: NsPath,
    block_hash_hex: HashPath,
    principal: PrincipalDep,
    store: StoreDep,
    durable: Annotated[bool, Query(description="acknowledge only once on disk")] = False,
    sent_sum: SumHeader = None,
) -> PutOut:
    """Store one block (its bytes are the body; the size must match the namespace; with an
    ``X-KVStore-Checksum`` header, the body must hash to it)."""
    ns, h = _resolve(store, principal, namespace, block_hash_hex)  # 404 before the body
    body = await request.body()
    ns.check_size(len(body))
    tier = request.app.state.durable_tier if durable else None
    sums = None if sent_sum is None else [int(sent_sum, 16)]
    result = await run_in_threadpool(durable_put, store, ns.name, [h], [body], durable, tier,
                                     sums)
    if result.refused and sums is not None and checksum(body) != sums[0]:
        raise ChecksumMismatchError(f"the body's xxh3-64 is {checksum(body):016x}, not the "
                                    f"{sent_sum} of the {CHECKSUM_HEADER} header: not stored")
    if result.refused:
        raise CapacityError("no room for the block: every evictable block is pinned")
    if not result.stored:
        response.status_code = 200
    return PutOut(**result._asdict())


@router.get(
    "/{namespace}/{block_hash_hex}",
    response_class=Response,
    responses={200: {"content": _OCTETS, "description": "the block's bytes"},
               **errors(400, 401, 404, 422, 503)},
)
async def get_block(
    request: Request,
    namespace: NsPath,
    block_hash_hex: HashPath,
    principal: PrincipalDep,
    store: StoreDep,
) -> Response:
    """The block's bytes, or 404 if the store does not hold it (or it failed its checksum);
    ``X-KVStore-Checksum`` gives their xxh3-64."""
    ns, h = _resolve(store, principal, namespace, block_hash_hex)
    fill: PeerFill | None = request.app.state.fill
    if fill is not None:  # in a cluster: another node may hold it
        await fill.before_read(run_in_threadpool, ns, [h])
    direct: DirectGet | None = request.app.state.direct_get
    if direct is None:  # no host slab: one worker-thread hop, its bytes are the body
        data = (await run_in_threadpool(store.get, ns.name, [h]))[0]
        if data is None:
            raise BlockNotFoundError(f"block {block_hash_hex} not found in {namespace!r}")
        return Response(content=data, media_type="application/octet-stream",
                        headers={CHECKSUM_HEADER: f"{checksum(data):016x}"})
    # pinned in the host slab and sent from there (server.rest.slab_body), or read from a
    # lower tier in a worker thread; the pin is taken here unless the store lock is busy
    got = await direct.read(ns.name, [h], ns.block_bytes, ns.block_bytes, "rest",
                            principal.tenant)
    if got.sizes[0] < 0:
        raise BlockNotFoundError(f"block {block_hash_hex} not found in {namespace!r}")
    # verified before sending (slab bytes) or when read (a copy): the header lets the
    # client check what it received
    csum = got.sums[0] if got.sums and got.sums[0] is not None else checksum_parts(got.pieces)
    reply = SlabResponse(got.pieces, got.sizes[0], got.after_send,
                         request.app.state.settings.frame_timeout_s)
    reply.headers[CHECKSUM_HEADER] = f"{csum:016x}"
    return reply


@router.delete(
    "/{namespace}/{block_hash_hex}",
    response_model=DeleteOut,
    responses=errors(400, 401, 404, 422, 503),
)
def delete_block(
    namespace: NsPath,
    block_hash_hex: HashPath,
    principal: PrincipalDep,
    store: StoreDep,
) -> DeleteOut:
    """Delete one block from every tier; ``deleted`` is 0 if it was absent."""
    ns, h = _resolve(store, principal, namespace, block_hash_hex)
    return DeleteOut(deleted=store.delete(ns.name, [h]))
