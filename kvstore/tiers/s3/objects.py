"""The S3 tier's bucket as block objects: every S3 request the tier makes, and what its
outcome means for health.

Each call reports to :class:`~kvstore.tiers.s3.health.S3Health`: a success clears a degraded
back end, a failure is classified (``client.classify``) and recorded with a message an
operator can act on. A missing key is an answer, not a fault, so it never degrades the tier.
Blocks are laid out as ``layout`` says (groups, pointers); a member whose bytes do not match
the checksum in its object's own metadata is counted as ``corrupt`` and never returned.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from kvstore.checksum import checksum
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3.client import (
    MISSING,
    NO_BUCKET,
    S3Settings,
    classify,
    describe,
    error_code,
    make_client,
)
from kvstore.tiers.s3.health import S3Health
from kvstore.tiers.s3.layout import (
    META_MEMBERS,
    Group,
    Where,
    group_headers,
    object_key,
    parse_group,
    parse_head,
    parse_key,
    pointer_headers,
)
from kvstore.types import BlockKey


class Batch(NamedTuple):
    """The blocks of one object, in order (what the write-back queue uploads)."""

    keys: tuple[BlockKey, ...]
    metas: tuple[BlockMeta, ...]

log = logging.getLogger("kvstore.s3")

_DELETE_BATCH = 1000  # keys per DeleteObjects request (the S3 maximum)


class S3Objects:
    """Blocks as objects in ``settings.bucket`` under ``settings.key_prefix``, through two
    boto3 clients: ``client`` for data and ``probe_client`` (no retries) for probing. Safe to
    call from many threads at once (boto3 clients are); nothing here knows about queues,
    capacity or which blocks the tier holds."""

    def __init__(self, settings: S3Settings, health: S3Health) -> None:
        self.settings = settings
        self.health = health
        self.client = make_client(settings)
        # The probe asks once and reports; botocore retries would only delay recovery.
        self.probe_client = make_client(settings, max_attempts=1)
        self._transfer = _transfer_config(settings.multipart_threshold)

    # -- per-object calls (pool threads) --------------------------------------------------
    def put(self, name: BlockKey, data: bytes, batch: Batch) -> None:
        """Write one object holding ``batch`` back to back under ``name`` (its first key), in
        parts from ``multipart_threshold`` on. Raises without reporting: the write-back queue
        reports and decides whether to retry."""
        s = self.settings
        headers = group_headers(name, batch.keys, batch.metas)
        object_name = object_key(s.key_prefix, name)
        if len(data) >= s.multipart_threshold:
            self.client.upload_fileobj(
                io.BytesIO(data),
                s.bucket,
                object_name,
                ExtraArgs={"Metadata": headers},
                Config=self._transfer,
            )
        else:
            self.client.put_object(Bucket=s.bucket, Key=object_name, Body=data, Metadata=headers)
        self.health.ok()

    def put_pointer(self, key: BlockKey, meta: BlockMeta, where: Where) -> str:
        """Write the empty object that lets another node find ``key`` in its group. Returns
        "" on success, else the failure's kind (reported). Never raises."""
        s = self.settings
        try:
            self.client.put_object(
                Bucket=s.bucket,
                Key=object_key(s.key_prefix, key),
                Body=b"",
                Metadata=pointer_headers(meta, where),
            )
        except Exception as exc:
            return self.report(exc)
        self.health.ok()
        return ""

    def read(
        self, group: BlockKey, members: Sequence[tuple[int, BlockKey]], size: int
    ) -> tuple[list[bytes | None], bool]:
        """(bytes of each ``(index, key)`` member of object ``group``, gone): one ranged GET
        spanning the members. A member is None when it cannot be read, its object no longer
        lists it at that index (replaced by another node), or it fails its own checksum
        (counted in ``corrupt``). ``gone`` is True when S3 says the object is not there or
        holds other blocks now. Never raises."""
        s = self.settings
        first = min(i for i, _ in members)
        last = max(i for i, _ in members)
        out: list[bytes | None] = [None] * len(members)
        try:
            resp = self.client.get_object(
                Bucket=s.bucket,
                Key=object_key(s.key_prefix, group),
                Range=f"bytes={first * size}-{(last + 1) * size - 1}",
            )
            stream = resp["Body"]
        except Exception as exc:
            if error_code(exc) == "InvalidRange":  # shorter now: replaced by another group
                return out, True
            return out, self.report(exc) == MISSING
        try:
            info = parse_group(resp.get("Metadata", {}), group[1])
            start, total = _content_range(resp.get("ContentRange"), resp.get("ContentLength", -1))
            if info is None or info.size != size or total != len(info.hashes) * size:
                self._corrupt(group, len(members))
                return out, False
            # One bytes object per block, straight off the stream: no body to slice and copy.
            if first * size > start:
                stream.read(first * size - start)
            pieces = [stream.read(size) for _ in range(first, last + 1)]
        except Exception as exc:
            self.report(exc)
            return out, False
        finally:
            stream.close()
        self.health.ok()
        gone = False
        for n, (index, key) in enumerate(members):
            if index >= len(info.hashes) or info.hashes[index] != key[1]:
                gone = True  # the object holds other blocks now
                continue
            piece = pieces[index - first]
            if len(piece) != size or checksum(piece) != info.sums[index]:
                self._corrupt(key, 1)
                continue
            out[n] = piece
        return out, gone

    def head(self, key: BlockKey) -> tuple[tuple[BlockMeta, Where] | None, bool]:
        """(meta and location, definitive): None with definitive True means S3 says "not
        there"; None with definitive False, that it could not say or the object is not ours."""
        found, _, definitive = self.head_group(key)
        return found, definitive

    def head_group(
        self, key: BlockKey
    ) -> tuple[tuple[BlockMeta, Where] | None, Group | None, bool]:
        """:meth:`head`, plus the members of the object named ``key`` when it is a group
        object of the right length (an alias too): one HEAD then finds a whole run."""
        s = self.settings
        try:
            resp = self.client.head_object(Bucket=s.bucket, Key=object_key(s.key_prefix, key))
        except Exception as exc:
            return None, None, self.report(exc) == MISSING
        self.health.ok()
        metadata, length = resp.get("Metadata", {}), int(resp.get("ContentLength", -1))
        group = parse_group(metadata, key[1]) if META_MEMBERS in metadata else None
        if group is not None and length != len(group.hashes) * group.size:
            group = None
        return parse_head(key, metadata, length), group, True

    def delete(self, keys: Sequence[BlockKey]) -> None:
        """Delete the objects named after ``keys`` (groups, pointers, single blocks), up to
        1000 per request; stops at the first failed request (reported; the objects left are
        orphans: still valid blocks, or pointers that read as a miss). Never raises."""
        s = self.settings
        names = [object_key(s.key_prefix, k) for k in keys]
        for start in range(0, len(names), _DELETE_BATCH):
            chunk = names[start : start + _DELETE_BATCH]
            try:
                self.client.delete_objects(
                    Bucket=s.bucket,
                    Delete={"Objects": [{"Key": n} for n in chunk], "Quiet": True},
                )
            except Exception as exc:
                self.report(exc)
                return
            self.health.ok()

    def list_keys(self) -> Iterator[list[BlockKey]]:
        """The block keys under the prefix, one listing page at a time (objects that are not
        blocks are skipped). Lazy; raises, unreported, when a page cannot be listed."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.settings.bucket, Prefix=self.settings.key_prefix
        )
        for page in pages:
            yield [
                k
                for obj in page.get("Contents", ())
                if (k := parse_key(self.settings.key_prefix, obj["Key"])) is not None
            ]

    # -- bucket ---------------------------------------------------------------------------
    def probe(self) -> bool:
        """Ask S3 once whether the bucket serves (a one-key listing: unlike HEAD it carries
        an error code, so bad credentials are named). Creates the bucket if configured."""
        s = self.settings
        try:
            self.probe_client.list_objects_v2(Bucket=s.bucket, Prefix=s.key_prefix, MaxKeys=1)
        except Exception as exc:
            if not (s.create_bucket and classify(exc) == NO_BUCKET and self._create_bucket()):
                self.report(exc)
                return False
        self.health.ok()
        return True

    def _create_bucket(self) -> bool:
        s = self.settings
        kwargs: dict[str, Any] = {"Bucket": s.bucket}
        if s.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": s.region}
        try:
            self.probe_client.create_bucket(**kwargs)
        except Exception as exc:
            self.report(exc)
            return False
        return True

    # -- outcomes and lifecycle -----------------------------------------------------------
    def report(self, exc: BaseException) -> str:
        """Record a failed request in ``health`` (unless the key was merely missing) and
        return its kind (``client.classify``)."""
        kind = classify(exc)
        if kind != MISSING:
            self.health.fail(kind, describe(kind, exc, self.settings))
        return kind

    def _corrupt(self, key: BlockKey, n: int) -> None:
        self.health.count("corrupt", n)
        log.warning("s3 object %s failed its checksum; treated as a miss", key[1].hex())

    def close(self) -> None:
        self.client.close()
        self.probe_client.close()


def _content_range(header: str | None, length: int) -> tuple[int, int]:
    """(first byte, object length) from ``Content-Range: bytes a-b/total``; a server that
    ignored the range sent the whole object."""
    if not header:
        return 0, length
    try:
        span, total = header.removeprefix("bytes ").split("/")
        return int(span.split("-")[0]), int(total)
    except ValueError:
        return 0, -1


def _transfer_config(threshold: int) -> Any:
    from boto3.s3.transfer import TransferConfig

    # Parts of at least 5 MiB (the S3 minimum); a few in flight per object, since the pool
    # already runs many objects at once.
    return TransferConfig(
        multipart_threshold=threshold,
        multipart_chunksize=max(5 << 20, min(threshold, 8 << 20)),
        max_concurrency=4,
    )
