"""The S3 tier's bucket as block objects: every S3 request the tier makes, and what its
outcome means for health.

Each call reports to :class:`~kvstore.tiers.s3.health.S3Health`: a success clears a degraded
back end, a failure is classified (``client.classify``) and recorded with a message an
operator can act on. A missing key is an answer, not a fault, so it never degrades the tier.
Blocks are laid out as ``layout`` says; a body that does not match the checksum in its own
metadata is counted as ``corrupt`` and never returned.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from kvstore.checksum import checksum
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3.client import MISSING, NO_BUCKET, S3Settings, classify, describe, make_client
from kvstore.tiers.s3.health import S3Health
from kvstore.tiers.s3.layout import meta_headers, object_key, parse_key, parse_meta
from kvstore.types import BlockKey

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
    def put(self, key: BlockKey, data: bytes, meta: BlockMeta) -> None:
        """Write one block (in parts from ``multipart_threshold`` on). Raises on failure
        without reporting it: the write-back queue reports and decides whether to retry."""
        s = self.settings
        name = object_key(s.key_prefix, key)
        if len(data) >= s.multipart_threshold:
            self.client.upload_fileobj(
                io.BytesIO(data),
                s.bucket,
                name,
                ExtraArgs={"Metadata": meta_headers(meta)},
                Config=self._transfer,
            )
        else:
            self.client.put_object(
                Bucket=s.bucket, Key=name, Body=data, Metadata=meta_headers(meta)
            )
        self.health.ok()

    def get(self, key: BlockKey) -> tuple[bytes | None, bool]:
        """(body, missing): body None when the object cannot be read or fails its checksum;
        missing True when S3 says the object is not there. Never raises."""
        s = self.settings
        try:
            resp = self.client.get_object(Bucket=s.bucket, Key=object_key(s.key_prefix, key))
            body: bytes = resp["Body"].read()
        except Exception as exc:
            return None, self.report(exc) == MISSING
        self.health.ok()
        meta = parse_meta(resp.get("Metadata", {}), len(body))
        if meta is None or checksum(body) != meta.checksum:
            self.health.count("corrupt")
            log.warning("s3 object %s failed its checksum; treated as a miss", key[1].hex())
            return None, False
        return body, False

    def head(self, key: BlockKey) -> tuple[BlockMeta | None, bool]:
        """(meta, definitive): meta None with definitive True means S3 says "not there"."""
        s = self.settings
        try:
            resp = self.client.head_object(Bucket=s.bucket, Key=object_key(s.key_prefix, key))
        except Exception as exc:
            return None, self.report(exc) == MISSING
        self.health.ok()
        return parse_meta(resp.get("Metadata", {}), int(resp.get("ContentLength", -1))), True

    def delete(self, keys: Sequence[BlockKey]) -> None:
        """Delete the objects of ``keys``, up to 1000 per request; stops at the first failed
        request (reported; the objects left are orphans, still valid blocks). Never raises."""
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

    def close(self) -> None:
        self.client.close()
        self.probe_client.close()


def _transfer_config(threshold: int) -> Any:
    from boto3.s3.transfer import TransferConfig

    # Parts of at least 5 MiB (the S3 minimum); a few in flight per object, since the pool
    # already runs many objects at once.
    return TransferConfig(
        multipart_threshold=threshold,
        multipart_chunksize=max(5 << 20, min(threshold, 8 << 20)),
        max_concurrency=4,
    )
