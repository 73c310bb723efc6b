"""How blocks are laid out in the bucket: runs of consecutive blocks as one group object, and
a small pointer object for every other member, so that any block is found from its key alone.

Key: ``prefix/namespace/hash-hex``. The object under a block's key is one of three kinds, told
apart by its user metadata (``x-amz-meta-kv-*``):

- a **single** block (a group of one): body = the block; ``kv-layout``, ``kv-checksum``
  (xxh3-64), ``kv-size``. This is also the layout of every object written before grouping.
- a **group** named after its first member: body = the members' bytes back to back (all of one
  size); the single block's three fields for member 0, plus ``kv-members`` (every member's
  hash, hex, comma-separated, in order) and ``kv-sums`` (every member's checksum). A member is
  read with a ranged GET and verified alone against its own checksum.
- a **pointer** for member ``i >= 1`` of a group: empty body; the member's own three fields
  plus ``kv-group`` (the group's first hash, hex) and ``kv-index`` (``i``, its ``pos``).

A HEAD of any block's key therefore yields its meta and where its bytes are, so discovery by
another node works exactly as with one object per block. A reader never trusts a location
blindly: the group object's own ``kv-members`` must list the block at that index and the
object's length must be members x size, else the read is a miss (the object was replaced).
Listing does not return user metadata, so ``scan`` HEADs the listed keys; every key lists
exactly one block (the group object its first member, each pointer its own). An **alias**
(the first member's hash plus a suffix) names a new group whose first member's own name still
holds another group with live blocks; its HEAD matches no block, so scans and discovery skip
it and only the node that wrote it reads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from kvstore.tiers.base import BlockMeta
from kvstore.types import BlockKey

META_LAYOUT = "kv-layout"
META_CHECKSUM = "kv-checksum"
META_SIZE = "kv-size"
META_MEMBERS = "kv-members"
META_SUMS = "kv-sums"
META_GROUP = "kv-group"
META_INDEX = "kv-index"
MAX_GROUP_BLOCKS = 16  # S3 user metadata is capped at 2 KiB: 16 hashes and sums fit


class Where(NamedTuple):
    """Where a block's bytes are: member ``pos`` of the object named after block ``group``."""

    group: BlockKey
    pos: int


class Group(NamedTuple):
    """What a group object's metadata says: its members' hashes and checksums, in order, and
    the one block size and layout id they share."""

    hashes: tuple[bytes, ...]
    sums: tuple[int, ...]
    size: int
    layout_id: int


def object_key(key_prefix: str, key: BlockKey) -> str:
    """``prefix/namespace/hash-hex`` (``key_prefix`` ends with ``/`` or is empty)."""
    return f"{key_prefix}{key[0]}/{key[1].hex()}"


def parse_key(key_prefix: str, name: str) -> BlockKey | None:
    """The block key of object ``name``, or None when it is not one of ours."""
    if not name.startswith(key_prefix):
        return None
    namespace, sep, hexhash = name[len(key_prefix) :].rpartition("/")
    if not sep or not namespace or "/" in namespace or not hexhash:
        return None
    try:
        return namespace, bytes.fromhex(hexhash)
    except ValueError:
        return None


def meta_headers(meta: BlockMeta) -> dict[str, str]:
    """The ``Metadata`` argument of a put (boto3 adds the ``x-amz-meta-`` prefix)."""
    return {
        META_LAYOUT: str(meta.layout_id),
        META_CHECKSUM: str(meta.checksum),
        META_SIZE: str(meta.size),
    }


def group_headers(
    name: BlockKey, keys: Sequence[BlockKey], metas: Sequence[BlockMeta]
) -> dict[str, str]:
    """Metadata of the object ``name`` holding ``keys`` back to back (a single block's for
    one key named after itself)."""
    headers = meta_headers(metas[0])
    if len(keys) > 1 or name != keys[0]:
        headers[META_MEMBERS] = ",".join(k[1].hex() for k in keys)
        headers[META_SUMS] = ",".join(str(m.checksum) for m in metas)
    return headers


def pointer_headers(meta: BlockMeta, where: Where) -> dict[str, str]:
    """Metadata of the empty object that points member ``where.pos`` to its group."""
    return {**meta_headers(meta), META_GROUP: where.group[1].hex(), META_INDEX: str(where.pos)}


def parse_meta(metadata: Mapping[str, str], content_length: int) -> BlockMeta | None:
    """The block meta of a single-block object from its user metadata (None if it lacks ours
    or the stored size disagrees with the object's length: a truncated or foreign object)."""
    meta = _block_meta(metadata)
    return meta if meta is not None and meta.size == content_length else None


def parse_head(
    key: BlockKey, metadata: Mapping[str, str], content_length: int
) -> tuple[BlockMeta, Where] | None:
    """Meta and location of block ``key`` from a HEAD of its key (any of the three kinds);
    None when the object is not a valid one of ours."""
    meta = _block_meta(metadata)
    if meta is None:
        return None
    if META_GROUP in metadata:  # a pointer: empty, index at least 1
        try:
            where = Where((key[0], bytes.fromhex(metadata[META_GROUP])), int(metadata[META_INDEX]))
        except (KeyError, ValueError):
            return None
        return (meta, where) if content_length == 0 and where.pos >= 1 else None
    group = parse_group(metadata, key[1])
    if group is None or group.hashes[0] != key[1] or group.sums[0] != meta.checksum:
        return None
    if content_length != len(group.hashes) * group.size or group.size != meta.size:
        return None
    return meta, Where(key, 0)


def parse_group(metadata: Mapping[str, str], name: bytes | None = None) -> Group | None:
    """The members of a group (or single-block) object from its metadata; ``name`` (the hash
    the object is named after) fills in the one member of a single-block object."""
    meta = _block_meta(metadata)
    if meta is None:
        return None
    if META_MEMBERS not in metadata:
        hashes: tuple[bytes, ...] = (name if name is not None else b"",)
        return Group(hashes, (int(meta.checksum or 0),), meta.size, meta.layout_id)
    try:
        hashes = tuple(bytes.fromhex(h) for h in metadata[META_MEMBERS].split(","))
        sums = tuple(int(s) for s in metadata[META_SUMS].split(","))
    except (KeyError, ValueError):
        return None
    if len(hashes) != len(sums) or not hashes:
        return None
    return Group(hashes, sums, meta.size, meta.layout_id)


def _block_meta(metadata: Mapping[str, str]) -> BlockMeta | None:
    try:
        return BlockMeta(
            int(metadata[META_LAYOUT]), int(metadata[META_CHECKSUM]), int(metadata[META_SIZE])
        )
    except (KeyError, ValueError):
        return None
