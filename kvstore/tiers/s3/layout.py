"""How a block is laid out in the bucket: one object per block.

Key: ``prefix/namespace/hash-hex``, so any node can address a block from its key alone (HEAD it
in ``discover``). Body: the raw block bytes. User metadata (``x-amz-meta-kv-*``): layout id,
xxh3-64 checksum and size, so a reader verifies the body against what the writer meant.

Listing does not return user metadata, so ``scan`` HEADs the listed keys in parallel; we keep
the key free of metadata because a key that carried the checksum could not be found by another
node that knows only the hash.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvstore.tiers.base import BlockMeta
from kvstore.types import BlockKey

META_LAYOUT = "kv-layout"
META_CHECKSUM = "kv-checksum"
META_SIZE = "kv-size"


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


def parse_meta(metadata: Mapping[str, str], content_length: int) -> BlockMeta | None:
    """The block meta of an object from its user metadata (None if it lacks ours or the
    stored size disagrees with the object's length: a truncated or foreign object)."""
    try:
        meta = BlockMeta(
            int(metadata[META_LAYOUT]), int(metadata[META_CHECKSUM]), int(metadata[META_SIZE])
        )
    except (KeyError, ValueError):
        return None
    return meta if meta.size == content_length else None
