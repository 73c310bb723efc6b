"""S3 tier settings, the boto3 client they build, and how S3 errors are classified.

Everything here is about talking to one bucket; nothing knows about blocks or queues. boto3 is
imported only when a client is built, so importing this module stays cheap.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

# Defaults, once, with units.
DEFAULT_REGION = "us-east-1"
DEFAULT_PREFIX = "kvstore"
DEFAULT_MAX_WORKERS = 16  # threads per pool (reads, writes); connections = 2x this
DEFAULT_CONNECT_TIMEOUT_S = 2.0  # seconds: a dead endpoint fails fast
DEFAULT_READ_TIMEOUT_S = 10.0  # seconds: one block, not a whole batch
DEFAULT_MAX_ATTEMPTS = 3  # botocore attempts per request, the first included (1 = no retry)
DEFAULT_RETRY_MODE = "standard"  # botocore: "standard" or "adaptive" (client-side rate limit)
DEFAULT_QUEUE_BYTES = 256 << 20  # bytes: write-back queue bound
DEFAULT_DEMOTE_RETRIES = 5  # our retries of one failed upload before it is dropped
DEFAULT_RETRY_BACKOFF_S = 0.25  # seconds: first backoff; doubles per retry
DEFAULT_RETRY_BACKOFF_MAX_S = 2.0  # seconds: backoff cap
DEFAULT_NEGATIVE_TTL_S = 2.0  # seconds a "not in S3" answer of discover is trusted
DEFAULT_PROBE_INTERVAL_S = 1.0  # seconds between health probes while degraded
DEFAULT_MULTIPART_THRESHOLD = 16 << 20  # bytes: larger objects upload in parts
DEFAULT_FLUSH_TIMEOUT_S = 60.0  # seconds flush()/close() wait for the write-back queue
DEFAULT_GROUP_BLOCKS = 8  # consecutive blocks per object (1 = one object per block), max 16
DEFAULT_GROUP_BYTES = 2 << 20  # bytes: a group object is at most this large (larger blocks: alone)
# a group object whose deleted members take more than this part of its bytes is rewritten
DEFAULT_COMPACT_DEAD_SHARE = 0.5
DEFAULT_CATALOG_MAP_SIZE = 64 << 30  # bytes of address space the catalog may grow into

AUTH_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "InvalidToken",
        "ExpiredToken",
        "InvalidClientTokenId",
        "AuthorizationHeaderMalformed",
        "403",
    }
)
MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
THROTTLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
)

# Error kinds returned by classify(). "missing" is an answer, not a fault.
MISSING, AUTH, NO_BUCKET, THROTTLED, UNAVAILABLE, OTHER = (
    "missing",
    "auth",
    "no_bucket",
    "throttled",
    "unavailable",
    "other",
)
FAULT_KINDS = frozenset({AUTH, NO_BUCKET, THROTTLED, UNAVAILABLE})  # these degrade the tier


@dataclass(frozen=True, slots=True)
class S3Settings:
    """Everything the S3 tier is configured with (the ``options`` of its ``TierConfig``).

    Credentials come the standard AWS way (environment, shared profile, instance role); the
    explicit ``access_key_id``/``secret_access_key`` are for tests and tools that talk to two
    accounts from one process.
    """

    bucket: str
    endpoint_url: str | None = None  # None = AWS
    region: str = DEFAULT_REGION
    prefix: str = DEFAULT_PREFIX
    addressing_style: str | None = None  # None: "path" with an endpoint, else "auto"
    profile: str | None = None  # shared-config profile name
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    max_workers: int = DEFAULT_MAX_WORKERS
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_mode: str = DEFAULT_RETRY_MODE
    queue_bytes: int = DEFAULT_QUEUE_BYTES
    demote_retries: int = DEFAULT_DEMOTE_RETRIES
    retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_S
    retry_backoff_max_s: float = DEFAULT_RETRY_BACKOFF_MAX_S
    negative_ttl_s: float = DEFAULT_NEGATIVE_TTL_S
    probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD
    flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S
    group_blocks: int = DEFAULT_GROUP_BLOCKS
    group_bytes: int = DEFAULT_GROUP_BYTES
    compact_dead_share: float = DEFAULT_COMPACT_DEAD_SHARE  # 1: never rewrite a group
    create_bucket: bool = False  # create the bucket at start if it is missing
    scan_on_start: bool = True  # False: scan() yields nothing; blocks are found by discover()
    # folder of the local catalog of what this node holds (None: a temporary one, removed at
    # close, so knowledge lasts as long as the tier; a path keeps it across restarts)
    catalog_path: str | None = None
    catalog_map_size: int = DEFAULT_CATALOG_MAP_SIZE

    def __post_init__(self) -> None:
        if not self.bucket:
            raise ValueError("s3 tier needs a bucket (option 'bucket')")
        if self.addressing_style not in (None, "path", "virtual", "auto"):
            raise ValueError(
                f"s3 addressing_style must be path, virtual or auto, got {self.addressing_style!r}"
            )
        if self.retry_mode not in ("standard", "adaptive", "legacy"):
            raise ValueError(f"s3 retry_mode must be standard or adaptive, got {self.retry_mode!r}")
        if not 1 <= self.group_blocks <= 16:  # 16 hashes fit S3's 2 KiB of user metadata
            raise ValueError(f"s3 group_blocks must be 1 to 16, got {self.group_blocks!r}")
        if not 0 < self.compact_dead_share <= 1:
            raise ValueError(
                f"s3 compact_dead_share must be above 0 and at most 1, got "
                f"{self.compact_dead_share!r}")
        names = ("max_workers", "max_attempts", "queue_bytes", "multipart_threshold", "group_bytes",
                 "catalog_map_size")
        for name in names:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"s3 {name} must be at least 1, got {getattr(self, name)!r}")
        if self.multipart_threshold < 5 << 20:
            raise ValueError("s3 multipart_threshold must be at least 5 MiB (the S3 part minimum)")
        for name in ("connect_timeout_s", "read_timeout_s", "probe_interval_s", "flush_timeout_s"):
            if float(getattr(self, name)) <= 0:
                raise ValueError(f"s3 {name} must be positive, got {getattr(self, name)!r}")
        for name in ("demote_retries", "retry_backoff_s", "retry_backoff_max_s", "negative_ttl_s"):
            if float(getattr(self, name)) < 0:
                raise ValueError(f"s3 {name} must not be negative, got {getattr(self, name)!r}")

    @property
    def catalog_identity(self) -> str:
        """What a catalog lists the objects of: the endpoint, the bucket and the prefix."""
        return f"{self.endpoint_url}|{self.bucket}|{self.key_prefix}"

    @property
    def key_prefix(self) -> str:
        """``prefix/`` (or empty): every object key of this tier starts with it."""
        p = self.prefix.strip("/")
        return f"{p}/" if p else ""

    def where(self) -> str:
        """``s3://bucket/prefix at endpoint`` for messages."""
        return f"s3://{self.bucket}/{self.key_prefix} at {self.endpoint_url or 'AWS'}"


def make_client(s: S3Settings, *, max_attempts: int | None = None) -> Any:
    """A thread-safe boto3 S3 client for ``s``. The connection pool holds one connection per
    thread of both pools (reads and writes) so no request waits for a socket."""
    import boto3
    from botocore.config import Config

    style = s.addressing_style or ("path" if s.endpoint_url else "auto")
    config = Config(
        region_name=s.region,
        signature_version="s3v4",
        s3={"addressing_style": style},
        max_pool_connections=2 * s.max_workers + 2,
        connect_timeout=s.connect_timeout_s,
        read_timeout=s.read_timeout_s,
        retries={"mode": s.retry_mode, "total_max_attempts": max_attempts or s.max_attempts},
        # Blocks carry their own xxh3 checksum, verified on read; botocore's extra CRC on
        # every body costs CPU and some S3-compatible servers reject the trailer headers.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    with _SESSIONS_LOCK:  # botocore sessions are not safe to create clients concurrently
        session = _SESSIONS.get(s.profile)
        if session is None:
            session = _SESSIONS[s.profile] = boto3.session.Session(profile_name=s.profile)
        return session.client(
            "s3",
            endpoint_url=s.endpoint_url,
            region_name=s.region,
            aws_access_key_id=s.access_key_id,
            aws_secret_access_key=s.secret_access_key,
            aws_session_token=s.session_token,
            config=config,
        )


# One boto3 session per profile for the process: a session parses the S3 service model once
# (about a second of CPU), and every client of every tier reuses it. Explicit keys are passed
# per client; without them the session resolves credentials the standard AWS way.
_SESSIONS: dict[str | None, Any] = {}
_SESSIONS_LOCK = threading.Lock()


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ``ClientError`` (``""`` for other exceptions)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    code = response.get("Error", {}).get("Code")
    if code:
        return str(code)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(status) if status else ""


def classify(exc: BaseException) -> str:
    """Which kind of failure ``exc`` is: :data:`MISSING`, :data:`AUTH`, :data:`NO_BUCKET`,
    :data:`THROTTLED`, :data:`UNAVAILABLE` (connection, timeout, 5xx) or :data:`OTHER`."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return AUTH
    if isinstance(exc, ClientError):
        code = error_code(exc)
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        if code in MISSING_CODES:
            return MISSING
        if code == "NoSuchBucket":
            return NO_BUCKET
        if code in AUTH_CODES or status == 403:
            return AUTH
        if code in THROTTLE_CODES or status in (429, 503):
            return THROTTLED
        if status >= 500:
            return UNAVAILABLE
        return OTHER
    if isinstance(exc, BotoCoreError | OSError):
        # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosed...
        return UNAVAILABLE
    return OTHER


def describe(kind: str, exc: BaseException, s: S3Settings) -> str:
    """A message an operator can act on."""
    code = error_code(exc) or type(exc).__name__
    if kind == AUTH:
        return (
            f"S3 rejected the credentials ({code}) for {s.where()}: check AWS_ACCESS_KEY_ID / "
            f"AWS_SECRET_ACCESS_KEY, the profile, or the bucket policy"
        )
    if kind == NO_BUCKET:
        return f"S3 bucket {s.bucket!r} does not exist at {s.endpoint_url or 'AWS'}"
    if kind == THROTTLED:
        return f"S3 is throttling ({code}) {s.where()}"
    if kind == UNAVAILABLE:
        return f"S3 unreachable or failing ({code}: {exc}) {s.where()}"
    return f"S3 error ({code}: {exc}) {s.where()}"
