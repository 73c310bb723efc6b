"""The S3 tier's pure parts without a server: object layout, error classification, and the
write-back queue's ordering rules driven by a real upload function that we control."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from kvstore.errors import TierUnavailableError
from kvstore.tiers.base import BlockMeta
from kvstore.tiers.s3.client import S3Settings, classify
from kvstore.tiers.s3.layout import meta_headers, object_key, parse_key, parse_meta
from kvstore.tiers.s3.writeback import WriteBack
from kvstore.types import BlockKey

META = BlockMeta(7, 123, 3)


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


def test_object_keys_round_trip_and_foreign_keys_are_ignored() -> None:
    k: BlockKey = ("llama@v1", b"\x00\x01\xff")
    assert object_key("kv/", k) == "kv/llama@v1/0001ff"
    assert parse_key("kv/", "kv/llama@v1/0001ff") == k
    assert object_key("", k) == "llama@v1/0001ff"
    for foreign in ("kv/0001ff", "kv/a/b/0001ff", "kv/ns/zz", "other/ns/00", "kv/ns/"):
        assert parse_key("kv/", foreign) is None, foreign


def test_settings_prefix_and_validation() -> None:
    assert S3Settings(bucket="b", prefix="/a/b/").key_prefix == "a/b/"
    assert S3Settings(bucket="b", prefix="").key_prefix == ""
    with pytest.raises(ValueError, match="multipart_threshold"):
        S3Settings(bucket="b", multipart_threshold=1 << 20)
    with pytest.raises(ValueError, match="addressing_style"):
        S3Settings(bucket="b", addressing_style="sideways")
    with pytest.raises(ValueError, match="max_workers"):
        S3Settings(bucket="b", max_workers=0)
    for share in (0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="compact_dead_share"):
            S3Settings(bucket="b", compact_dead_share=share)


def test_metadata_must_be_complete_and_match_the_length() -> None:
    headers = meta_headers(META)
    assert parse_meta(headers, 3) == META
    assert parse_meta(headers, 4) is None  # truncated or replaced body
    assert parse_meta({k: v for k, v in headers.items() if k != "kv-checksum"}, 3) is None
    assert parse_meta({**headers, "kv-layout": "x"}, 3) is None


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (client_error("NoSuchKey", 404), "missing"),
        (client_error("404", 404), "missing"),
        (client_error("SignatureDoesNotMatch", 403), "auth"),
        (client_error("403", 403), "auth"),  # HEAD: no body, only the status
        (client_error("NoSuchBucket", 404), "no_bucket"),
        (client_error("SlowDown", 503), "throttled"),
        (client_error("TooManyRequests", 429), "throttled"),
        (client_error("InternalError", 500), "unavailable"),
        (client_error("InvalidArgument", 400), "other"),
        (EndpointConnectionError(endpoint_url="http://x"), "unavailable"),
        (NoCredentialsError(), "auth"),
        (ValueError("x"), "other"),
    ],
)
def test_classify(exc: BaseException, kind: str) -> None:
    assert classify(exc) == kind


class Uploads:
    """An upload function whose calls block until released, and that fails on request."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.done: list[tuple[BlockKey, bytes]] = []
        self.fail: list[BaseException] = []
        self.dropped: list[BlockKey] = []
        self.orphans: list[BlockKey] = []
        self.started = threading.Semaphore(0)

    def upload(self, key: BlockKey, data: bytes, meta: BlockMeta) -> None:
        self.started.release()
        self.gate.wait(10)
        if self.fail:
            raise self.fail.pop(0)
        self.done.append((key, data))

    def queue(self, pool: ThreadPoolExecutor, max_bytes: int = 100, retries: int = 2) -> WriteBack:
        return WriteBack(
            pool,
            self.upload,
            classify,
            self.dropped.append,
            self.orphans.append,
            max_bytes=max_bytes,
            retries=retries,
            backoff_s=0.001,
            backoff_max_s=0.01,
        )


K1: BlockKey = ("ns", b"1")


def test_overwrite_while_uploading_uploads_the_newest_bytes_last() -> None:
    up = Uploads()
    with ThreadPoolExecutor(2) as pool:
        wb = up.queue(pool)
        up.gate.clear()
        wb.submit([(K1, b"old", META)])
        up.started.acquire(timeout=5)  # "old" is in flight
        wb.submit([(K1, b"new", META)])
        assert wb.get(K1) is not None and wb.get(K1).data == b"new"  # type: ignore[union-attr]
        up.gate.set()
        assert wb.wait_idle(5)
    assert up.done[-1] == (K1, b"new")
    assert wb.stats().pending_bytes == 0 and not up.orphans


def test_delete_while_uploading_reports_an_orphan() -> None:
    up = Uploads()
    with ThreadPoolExecutor(1) as pool:
        wb = up.queue(pool)
        up.gate.clear()
        wb.submit([(K1, b"abc", META)])
        up.started.acquire(timeout=5)
        wb.cancel([K1])
        assert wb.get(K1) is None
        up.gate.set()
    assert up.done == [(K1, b"abc")] and up.orphans == [K1]


def test_queue_is_bounded_all_or_nothing() -> None:
    up = Uploads()
    with ThreadPoolExecutor(1) as pool:
        wb = up.queue(pool, max_bytes=10)
        up.gate.clear()
        wb.submit([(("ns", b"a"), b"x" * 6, META)])
        with pytest.raises(TierUnavailableError, match="queue full"):
            wb.submit([(("ns", b"b"), b"x" * 3, META), (("ns", b"c"), b"x" * 3, META)])
        assert wb.get(("ns", b"b")) is None and wb.stats().pending_bytes == 6
        wb.submit([(("ns", b"a"), b"x" * 10, META)])  # replacing frees the old bytes
        up.gate.set()
        assert wb.wait_idle(5)


def test_transient_failures_retry_then_drop_and_permanent_ones_drop_at_once() -> None:
    up = Uploads()
    with ThreadPoolExecutor(1) as pool:
        wb = up.queue(pool, retries=2)
        up.fail = [client_error("SlowDown", 503)] * 2
        wb.submit([(K1, b"a", META)])
        assert wb.wait_idle(5) and up.done == [(K1, b"a")] and not up.dropped
        up.fail = [client_error("InternalError", 500)] * 3
        wb.submit([(("ns", b"2"), b"b", META)])
        assert wb.wait_idle(5) and up.dropped == [("ns", b"2")]
        up.fail = [client_error("SignatureDoesNotMatch", 403), client_error("x", 500)]
        wb.submit([(("ns", b"3"), b"c", META)])
        assert wb.wait_idle(5) and up.dropped[-1] == ("ns", b"3")
        assert len(up.fail) == 1  # credentials: no retry
