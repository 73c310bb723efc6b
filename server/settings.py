"""Server settings: one validated object built from flags, ``KVSTORE_*`` variables and a YAML
file, in that order of precedence (a flag beats the environment, which beats the file).

Every field is a flag (``--host-capacity``), a variable (``KVSTORE_HOST_CAPACITY``) and a YAML
key (``host_capacity``). Sizes accept plain bytes or units: ``512MiB``, ``10GiB``, ``1.5GB``.
The embedded defaults serve with no configuration at all: 1 GiB host RAM tier in shared
memory plus a 16 GiB LMDB disk tier under ``./data``, bound to 127.0.0.1.

The fields and their checks are here; reading the YAML file is :mod:`server.config_file`,
and the store the settings describe is :mod:`server.store_config`.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from kvstore.cli_kit import is_loopback
from kvstore.cluster.config import ClusterConfig
from kvstore.config import (
    DEFAULT_DISK_CAPACITY,
    DEFAULT_GHOST_ENTRIES,
    DEFAULT_HOST_CAPACITY,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_LEASE_S,
    DEFAULT_MAX_NAMESPACES,
    DEFAULT_MAX_NAMESPACES_PER_TENANT,
    DEFAULT_MAX_PREFETCH_BLOCKS,
    StoreConfig,
    TierConfig,
)
from kvstore.namespace import check_tenant_name
from kvstore.policy import POLICIES
from server.cluster_config import check_cluster, cluster_config_of
from server.config_file import ConfigFileError, reading, yaml_sources
from server.setting_types import LogLevel, Names, Size, Token, lower
from server.store_config import pin_quota_of, store_config_of
from server.token_files import fill_tokens_from_files

__all__ = ["ConfigFileError", "ServerSettings", "load_settings"]


_VISIBLE = "VISIBLE IN THE PROCESS LIST (ps) to every local user: prefer {0} or {1}"



class ServerSettings(BaseSettings):
    """Everything ``kvstore serve`` needs. Validated once at start; a bad value fails loudly."""

    model_config = SettingsConfigDict(
        env_prefix="KVSTORE_", extra="forbid", frozen=True, hide_input_in_errors=True
    )

    # -- network --------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="bind address of REST and the TCP data plane; "
                      "beyond loopback a token is required")
    port: int = Field(8470, ge=1, le=65535, description="REST control plane port")
    data_port: int = Field(8471, ge=0, le=65535, description="TCP data plane port; 0: off")
    unix_socket: str | None = Field(None, description="data plane Unix socket (mode 0600); "
                                    "none: <data_dir>/kvstore.sock")
    enable_unix_socket: bool = Field(True, description="serve the data plane on the Unix "
                                     "socket too")
    enable_shm: bool = Field(True, description="offer the host tier's shared memory to local "
                             "clients (the zero-copy path)")
    # -- storage --------------------------------------------------------------------------
    data_dir: str = Field("./data", description="folder of the LMDB file, the S3 catalog, "
                          "namespaces.json, the Unix socket and the lock")
    host_capacity: Size = Field(DEFAULT_HOST_CAPACITY, description="host RAM tier, in shared "
                                "memory; 0: none")
    host_slot_bytes: Size = Field(0, description="slot size of the host slab; 0: the tier's "
                                  "default")
    # deprecated, ignored: the host slab is an anonymous memfd, handed to trusted local
    # clients over the Unix socket (no name in /dev/shm); a warning is logged when set
    shm_name: str | None = Field(None, description="deprecated and ignored: the host slab is "
                                 "an anonymous memfd")
    disk_capacity: Size = Field(DEFAULT_DISK_CAPACITY, description="LMDB disk tier; 0: none")
    disk_write_through: bool = Field(False, description="write every put to disk before it is "
                                     "acknowledged")
    background_demotion: bool = Field(True, description="settle the host tier into the disk "
                                      "tier from a background thread, the disk write off the "
                                      "store lock (gets and puts beside a demoting put do not "
                                      "wait for the disk); false: in the put that fills it")
    device_capacity: Size = Field(0, description="device tier (a torch tensor); 0: none")
    device: str = Field("cpu", description="torch device of the device tier, e.g. cuda:0")
    s3_endpoint: str | None = Field(None, description="S3 endpoint URL (MinIO, SeaweedFS, "
                                    "Ceph); none: AWS")
    s3_bucket: str | None = Field(None, description="S3 bucket; setting it enables the S3 tier")
    s3_prefix: str = Field("kvstore/", description="key prefix of the S3 tier's objects")
    s3_region: str | None = Field(None, description="S3 region")
    s3_capacity: Size = Field(1 << 40, description="bytes the S3 tier may hold")
    policy: str = Field("lru", description="eviction policy of every tier: lru, lfu, "
                        "s3fifo, or sampled_lru, sampled_lfu, sampled_s3fifo (no object per "
                        "block; the disk tier always uses the sampled form of the rule)")
    ghost_entries: int = Field(DEFAULT_GHOST_ENTRIES, ge=0, description="blocks that left the "
                               "store remembered with when, from which tier and why, for "
                               "kvstore explain (about 200 bytes each); 0: none")
    whatif_sample_rate: float = Field(0.01, ge=0, le=1, description="share of block hashes "
                                      "the what-if curves follow (GET /v1/whatif); 0: off")
    whatif_max_keys: int = Field(1 << 17, ge=16, description="blocks each tier's what-if "
                                 "tracker follows at most (about 200 bytes each); past it the "
                                 "sample rate is lowered")
    whatif_policies: Names = Field(default_factory=list, description="other eviction "
                                   "policies each tier's curve is also simulated for, "
                                   "separated by commas (GET /v1/whatif?policy=lfu)")
    prefill_tokens_per_s: float | None = Field(None, gt=0, description="the engines' prefill "
                                               "rate: the capacity advisor prices misses in "
                                               "prefill seconds at it; none: in tokens")
    lease_s: float = Field(DEFAULT_LEASE_S, gt=0, allow_inf_nan=False,
                           description="seconds a pin or reservation lasts when the client "
                           "names no lease")
    # -- security and limits --------------------------------------------------------------
    token: Token | None = Field(None, description="admin bearer token (sees every "
                                    "namespace). " + _VISIBLE.format("--token-file",
                                                                     "KVSTORE_TOKEN"))
    tenant_tokens: dict[str, Token] = Field(
        default_factory=dict, description="JSON map tenant -> token, e.g. '{\"a\": \"tok\"}'. "
        + _VISIBLE.format("--tenant-tokens-file", "KVSTORE_TENANT_TOKENS"))
    max_request_bytes: Size = Field(64 << 20, description="REST request body limit (413 above)")
    max_frame_bytes: Size = Field(256 << 20, description="data plane payload limit per frame")
    max_header_bytes: Size = Field(8 << 20, description="data plane msgpack header limit per "
                                   "frame")
    max_batch: int = Field(65536, ge=1, description="block hashes per request")
    recv_buffer_bytes: Size = Field(256 << 20, description="idle data plane receive buffers "
                                    "kept for reuse, all connections together")
    frame_timeout_s: float = Field(10.0, gt=0, description="seconds a started data plane "
                                   "frame, or the body of a REST block GET, may take to "
                                   "complete")
    idle_timeout_s: float = Field(600.0, gt=0, description="seconds before a silent data plane "
                                  "connection is closed")
    max_connections: int = Field(1024, ge=1, description="data plane connections, and "
                                 "authenticated REST requests in flight (503 above)")
    shutdown_grace_s: float = Field(10.0, ge=0, description="seconds in-flight requests may "
                                    "take to finish at shutdown")
    max_namespaces: int = Field(DEFAULT_MAX_NAMESPACES, ge=1, description="namespaces "
                                "registered, all tenants together")
    max_namespaces_per_tenant: int = Field(DEFAULT_MAX_NAMESPACES_PER_TENANT, ge=1,
                                           description="namespaces one tenant may register")
    log_level: Annotated[LogLevel, BeforeValidator(lower)] = Field(
        "info", description="log level: critical, error, warning, info or debug")
    log_format: Literal["text", "json"] = Field("text", description="log lines as text, or "
                                                "one JSON object a line")
    access_log: bool = Field(False, description="log every REST request at info")
    # uvloop (the default where it is installed) halves the event loop's cost per frame
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto", description="event loop: auto (uvloop where installed), uvloop or asyncio")
    # -- secrets from files, and the REST plane's bounds ------------------------
    token_file: str | None = Field(None, description="file holding the admin token (mode "
                                   "0600); keeps it out of the process list")
    tenant_tokens_file: str | None = Field(None, description="file holding the JSON map "
                                           "tenant -> token (mode 0600)")
    rest_body_budget_bytes: Size = Field(256 << 20, description="REST request body bytes in "
                                         "flight, all requests together (503 above)")
    rest_header_timeout_s: float = Field(5.0, gt=0, description="seconds a REST request's "
                                         "headers may take (then 408 and close)")
    rest_body_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False,
                                       description="seconds a REST request's whole body may "
                                       "take once its headers are in (then 408 and close)")
    rest_body_budget_per_tenant_bytes: Size = Field(
        0, description="REST request body bytes in flight of one tenant (--tenant-tokens; 429 "
        "above), so that one tenant's uploads never take the whole budget. 0: a quarter of "
        "rest_body_budget_bytes; the admin token draws on the whole budget")
    rest_max_pending_connections: int = Field(256, ge=1, description="REST connections still "
                                              "sending headers; past it the oldest is closed")

    # -- data plane trust boundary --------------------------------------------------------
    hello_timeout_s: float = Field(5.0, gt=0, description="seconds a data plane connection "
                                   "has to say hello")
    max_pending_connections: int = Field(64, ge=1, description="data plane connections before "
                                         "their hello; past it the oldest is closed")
    max_unauth_frame_bytes: Size = Field(64 << 10, description="header + payload of a data "
                                         "plane frame before hello")
    frame_budget_bytes: Size = Field(1 << 30, description="data plane frames being received "
                                     "and get replies being built, all connections together")
    frame_budget_wait_s: float = Field(5.0, gt=0, description="seconds a frame waits for room "
                                       "in the frame budget, then busy")

    # -- pins: how long, how much, and after a client is gone -----------------------------
    max_lease_s: float = Field(DEFAULT_MAX_LEASE_S, gt=0, allow_inf_nan=False,
                               description="longest lease, seconds: every pin, grant "
                               "(shm_lookup), read or reservation asking for longer gets this")
    max_pinned_bytes_per_tenant: Size = Field(0, description="bytes one tenant "
                                              "(--tenant-tokens) may hold pinned at once; past "
                                              "it pins fail with pin_quota. 0: a quarter of "
                                              "the top tier")
    grant_grace_s: float = Field(5.0, ge=0, allow_inf_nan=False,
                                 description="seconds a client's grants (shm_lookup pins) "
                                 "outlive its last connection, for workers still copying them")
    # -- what one tenant or connection may hold of the data plane -------------------------
    max_connections_per_tenant: int = Field(0, ge=0, description="data plane connections one "
                                            "tenant (--tenant-tokens) may hold; past it busy. "
                                            "0: a quarter of max_connections")
    max_prefetch_blocks: int = Field(DEFAULT_MAX_PREFETCH_BLOCKS, ge=1, description="blocks "
                                     "queued for prefetch, all clients together; past it busy")
    max_prefetch_blocks_per_connection: int = Field(65536, ge=1, description="blocks one data "
                                                    "plane connection may have queued for "
                                                    "prefetch; past it busy")

    cluster: SecretStr | None = Field(None, description="Redis URL of the cluster this node "
                                      "joins: redis://HOST:PORT/DB, rediss:// for TLS (a "
                                      "password in it is never shown); none: a node alone")
    node_id: str | None = Field(None, min_length=1, max_length=200, description="this node's "
                                "name in the cluster, kept across restarts (default: its "
                                "advertised address)")
    advertise: str | None = Field(None, description="HOST:PORT of this node's data plane as "
                                  "peers dial it (default: the bound host, or this machine's "
                                  "name when bound to every address, and data_port)")
    cluster_token: Token | None = Field(None, description="the token the nodes of a "
                                            "cluster present to each other (accepted as the "
                                            "admin's). " + _VISIBLE.format(
                                                "--cluster-token-file", "KVSTORE_CLUSTER_TOKEN"))
    cluster_token_file: str | None = Field(None, description="file holding the cluster token "
                                           "(mode 0600)")
    cluster_heartbeat_s: float = Field(1.0, gt=0, le=60, allow_inf_nan=False,
                                       description="seconds between heartbeats; a node silent "
                                       "3 of them is suspect, 10 of them gone")
    cluster_index_bits: int = Field(16, ge=0, le=24, description="block index buckets per "
                                    "namespace = 2**bits; best near blocks per namespace / 64 "
                                    "(the first node's value holds for the whole cluster)")

    @field_validator("policy", "whatif_policies")
    @classmethod
    def _known_policy(cls, names: str | list[str]) -> str | list[str]:
        for name in [names] if isinstance(names, str) else names:
            POLICIES.resolve(name)  # ValueError naming the known policies
        return names

    @field_validator("tenant_tokens")
    @classmethod
    def _tenant_names(cls, tokens: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for tenant in tokens:  # a tenant's name is part of its namespaces' names in the store
            check_tenant_name(tenant)
        return tokens

    @model_validator(mode="before")
    @classmethod
    def _read_token_files(cls, data: Any) -> Any:
        return fill_tokens_from_files(data)

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        if not is_loopback(self.host) and self.token is None and not self.tenant_tokens:
            raise ValueError(
                f"binding to non-loopback address {self.host!r} requires a token "
                "(--token-file, KVSTORE_TOKEN or --token)"
            )
        path = self.socket_path
        if path is not None and len(path.encode()) > 100:
            raise ValueError(f"Unix socket path {path!r} is too long for the OS (over 100 "
                             "bytes); set unix_socket to a shorter path")
        if self.frame_budget_bytes < self.max_frame_bytes + self.max_header_bytes:
            raise ValueError(
                f"frame_budget_bytes ({self.frame_budget_bytes}) must hold one whole frame: "
                f"at least max_frame_bytes + max_header_bytes "
                f"({self.max_frame_bytes + self.max_header_bytes})")
        if self.shm_name is not None:
            logging.getLogger("kvstore.server").warning(
                "shm_name is deprecated and ignored: the host slab is an anonymous memfd that "
                "local clients receive over the authenticated Unix socket")
        if self.host_capacity == 0 and self.disk_capacity == 0 and self.device_capacity == 0 \
                and self.s3_bucket is None:
            raise ValueError("configure at least one tier (host, disk, device or s3 capacity)")
        if self.cluster is not None:
            check_cluster(self)
        if self.device != "cpu" and self.device_capacity == 0:
            raise ValueError(f"device {self.device!r} is used only by the device tier: set "
                             "device_capacity too (e.g. --device-capacity 4GiB)")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, *yaml_sources(settings_cls))

    # -- derived values -------------------------------------------------------------------
    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    @property
    def socket_path(self) -> str | None:
        if not self.enable_unix_socket:
            return None
        return self.unix_socket or str(self.data_path / "kvstore.sock")

    @property
    def shm(self) -> str:
        """The host slab's shared-memory name: stable for a data dir, so that a restart after
        a crash reuses (and so reclaims) the segment the dead process left behind."""
        if self.shm_name:
            return self.shm_name
        digest = hashlib.sha1(str(self.data_path).encode()).hexdigest()[:12]
        return f"kvstore-{digest}"

    def auth_enabled(self) -> bool:
        return self.token is not None or bool(self.tenant_tokens) \
            or self.cluster_token is not None

    def tenant_connections(self) -> int:
        """Data plane connections one tenant may hold: ``max_connections_per_tenant``, or by
        default a quarter of ``max_connections`` (the admin's are not counted)."""
        return self.max_connections_per_tenant or max(1, self.max_connections // 4)

    def pin_quota(self, top: TierConfig) -> int:
        """See :func:`server.store_config.pin_quota_of`."""
        return pin_quota_of(self, top)

    def store_config(self) -> StoreConfig:
        """See :func:`server.store_config.store_config_of`."""
        return store_config_of(self)

    def cluster_config(self) -> ClusterConfig | None:
        """See :func:`server.cluster_config.cluster_config_of`."""
        return cluster_config_of(self)


def load_settings(config: str | os.PathLike[str] | None = None, **flags: Any) -> ServerSettings:
    """Settings from ``flags`` (None values are ignored), ``KVSTORE_*`` and the YAML file at
    ``config`` (or ``KVSTORE_CONFIG``). Raises ``pydantic.ValidationError`` on bad values,
    ``FileNotFoundError`` for a missing config file and :class:`ConfigFileError` for one that
    is not a YAML mapping."""
    given = {k: v for k, v in flags.items() if v is not None}
    with reading(config if config is not None else os.environ.get("KVSTORE_CONFIG")):
        return ServerSettings(**given)
