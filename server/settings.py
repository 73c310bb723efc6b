"""Server settings: one validated object built from flags, ``KVSTORE_*`` variables and a YAML
file, in that order of precedence (a flag beats the environment, which beats the file).

Every field is a flag (``--host-capacity``), a variable (``KVSTORE_HOST_CAPACITY``) and a YAML
key (``host_capacity``). Sizes accept plain bytes or units: ``512MiB``, ``10GiB``, ``1.5GB``.
The embedded defaults serve with no configuration at all: 1 GiB host RAM tier in shared
memory plus a 16 GiB LMDB disk tier under ``./data``, bound to 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from kvstore.config import (
    DEFAULT_DISK_CAPACITY,
    DEFAULT_HOST_CAPACITY,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_LEASE_S,
    DEFAULT_MAX_NAMESPACES,
    DEFAULT_MAX_NAMESPACES_PER_TENANT,
    StoreConfig,
    TierConfig,
)
from server.token_files import fill_tokens_from_files

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30,
    "ti": 1 << 40, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value: Any) -> int:
    """Bytes from an int or a string such as ``"512MiB"``, ``"10GiB"``, ``"1.5GB"``, ``"4096"``.
    Raises ``ValueError`` naming the accepted units on anything else."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"not a size: {value!r}")
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"not a size: {value!r}; use bytes or a number with a unit such as 512MiB, 10GiB, "
            "1.5GB (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


Size = Annotated[int, BeforeValidator(parse_size), Field(ge=0)]

_yaml_path: ContextVar[str | None] = ContextVar("kvstore_yaml_path", default=None)


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerSettings(BaseSettings):
    """Everything ``kvstore serve`` needs. Validated once at start; a bad value fails loudly."""

    model_config = SettingsConfigDict(
        env_prefix="KVSTORE_", extra="forbid", frozen=True, hide_input_in_errors=True
    )

    # -- network --------------------------------------------------------------------------
    host: str = "127.0.0.1"  # REST and TCP data plane bind address
    port: int = Field(8470, ge=1, le=65535)  # REST control plane
    data_port: int = Field(8471, ge=0, le=65535)  # TCP data plane; 0 disables it
    unix_socket: str | None = None  # data plane Unix socket; default <data_dir>/kvstore.sock
    enable_unix_socket: bool = True
    enable_shm: bool = True  # offer the host tier's shared memory to local clients
    # -- storage --------------------------------------------------------------------------
    data_dir: str = "./data"
    host_capacity: Size = DEFAULT_HOST_CAPACITY  # bytes of host RAM (shared memory); 0: none
    host_slot_bytes: Size = 0  # slot size of the host slab; 0: the tier's default
    # deprecated, ignored: the host slab is an anonymous memfd, handed to trusted local
    # clients over the Unix socket (no name in /dev/shm); a warning is logged when set
    shm_name: str | None = None
    disk_capacity: Size = DEFAULT_DISK_CAPACITY  # bytes of LMDB; 0: no disk tier
    disk_write_through: bool = False  # every put also lands on disk before it is acknowledged
    device_capacity: Size = 0  # bytes of device memory; 0: no device tier
    device: str = "cpu"  # torch device of the device tier, e.g. cuda:0
    s3_endpoint: str | None = None
    s3_bucket: str | None = None  # set to enable the s3 tier
    s3_prefix: str = "kvstore/"
    s3_region: str | None = None
    s3_capacity: Size = 1 << 40  # bytes the s3 tier may hold
    policy: str = "lru"  # eviction policy of every tier
    lease_s: float = Field(DEFAULT_LEASE_S, gt=0, allow_inf_nan=False)  # default pin lease
    # -- security and limits --------------------------------------------------------------
    token: SecretStr | None = None  # admin bearer token (sees every namespace)
    tenant_tokens: dict[str, SecretStr] = Field(default_factory=dict)  # tenant -> token
    max_request_bytes: Size = 64 << 20  # REST request body limit
    max_frame_bytes: Size = 256 << 20  # data plane payload limit per frame
    max_header_bytes: Size = 8 << 20  # data plane msgpack header limit per frame
    max_batch: int = Field(65536, ge=1)  # hashes per request
    recv_buffer_bytes: Size = 256 << 20  # idle data plane receive buffers kept for reuse
    frame_timeout_s: float = Field(10.0, gt=0)  # a started frame must complete within this
    idle_timeout_s: float = Field(600.0, gt=0)  # a silent data plane connection is closed
    max_connections: int = Field(1024, ge=1)  # data plane connections at once
    shutdown_grace_s: float = Field(10.0, ge=0)  # how long in-flight requests may finish
    max_namespaces: int = Field(DEFAULT_MAX_NAMESPACES, ge=1)  # registered, all tenants
    max_namespaces_per_tenant: int = Field(DEFAULT_MAX_NAMESPACES_PER_TENANT, ge=1)
    log_level: str = "info"
    # uvloop (the default where it is installed) halves the event loop's cost per frame
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # -- secrets from files, and the REST plane's bounds (issue 14) ------------------------
    token_file: str | None = None  # file holding the admin token (keeps it out of `ps`)
    tenant_tokens_file: str | None = None  # file holding the JSON map tenant -> token
    rest_body_budget_bytes: Size = 256 << 20  # REST body bytes in flight, all requests
    rest_header_timeout_s: float = Field(5.0, gt=0)  # a REST request's headers must arrive
    rest_max_pending_connections: int = Field(256, ge=1)  # REST conns awaiting headers

    # -- data plane trust boundary --------------------------------------------------------
    hello_timeout_s: float = Field(5.0, gt=0)  # a data plane connection must say hello within
    max_pending_connections: int = Field(64, ge=1)  # data plane connections before their hello
    max_unauth_frame_bytes: Size = 64 << 10  # header + payload of a frame before hello
    frame_budget_bytes: Size = 1 << 30  # frames being received + get replies, all connections
    frame_budget_wait_s: float = Field(5.0, gt=0)  # a frame waits this long for budget room

    # -- pins: how long, how much, and after a client is gone -----------------------------
    max_lease_s: float = Field(DEFAULT_MAX_LEASE_S, gt=0, allow_inf_nan=False)  # longer: cut
    max_pinned_bytes_per_tenant: Size = 0  # with tenant tokens; 0: a quarter of the top tier
    grant_grace_s: float = Field(5.0, ge=0, allow_inf_nan=False)  # grants after a disconnect

    @model_validator(mode="before")
    @classmethod
    def _read_token_files(cls, data: Any) -> Any:
        return fill_tokens_from_files(data)

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        if not _is_loopback(self.host) and self.token is None and not self.tenant_tokens:
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
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _yaml_path.get()
        if path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)

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
        return self.token is not None or bool(self.tenant_tokens)

    def pin_quota(self, top: TierConfig) -> int:
        """Bytes one tenant may hold pinned: ``max_pinned_bytes_per_tenant``, or by default a
        quarter of the top tier, so that no one tenant's pins can hold more than a quarter of
        the tier that every put and promotion lands in. Only pins taken for a tenant (a tenant
        token) are charged; the admin's are not."""
        return self.max_pinned_bytes_per_tenant or max(1, top.capacity_bytes // 4)

    def store_config(self) -> StoreConfig:
        """Tiers top to bottom as configured; namespaces persist under the data dir."""
        tiers: list[TierConfig] = []
        if self.device_capacity:
            tiers.append(TierConfig("device", self.device_capacity, policy=self.policy,
                                    options={"device": self.device}))
        if self.host_capacity:
            # memfd: no /dev/shm name; clients get the descriptor only from the data plane
            options: dict[str, Any] = {"shm_name": self.shm, "memfd": True}
            if self.host_slot_bytes:
                options["slot_bytes"] = self.host_slot_bytes
            tiers.append(TierConfig("host", self.host_capacity, policy=self.policy,
                                    options=options))
        if self.disk_capacity:
            tiers.append(TierConfig("disk", self.disk_capacity, policy=self.policy,
                                    write_through=self.disk_write_through,
                                    options={"path": str(self.data_path / "lmdb")}))
        if self.s3_bucket:
            s3: dict[str, Any] = {"bucket": self.s3_bucket, "prefix": self.s3_prefix}
            if self.s3_endpoint:
                s3["endpoint"] = self.s3_endpoint
            if self.s3_region:
                s3["region"] = self.s3_region
            tiers.append(TierConfig("s3", self.s3_capacity, policy=self.policy, options=s3))
        return StoreConfig(
            tiers=tuple(tiers),
            default_lease_s=min(self.lease_s, self.max_lease_s),  # cut like every lease
            max_lease_s=self.max_lease_s,
            max_pinned_bytes_per_tenant=self.pin_quota(tiers[0]),
            namespaces_path=str(self.data_path / "namespaces.json"),
            max_namespaces=self.max_namespaces,
            max_namespaces_per_tenant=self.max_namespaces_per_tenant,
        )


def load_settings(config: str | os.PathLike[str] | None = None, **flags: Any) -> ServerSettings:
    """Settings from ``flags`` (None values are ignored), ``KVSTORE_*`` and the YAML file at
    ``config`` (or ``KVSTORE_CONFIG``). Raises ``pydantic.ValidationError`` on bad values and
    ``FileNotFoundError`` for a missing config file."""
    path = config if config is not None else os.environ.get("KVSTORE_CONFIG")
    if path is not None and not Path(path).is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    given = {k: v for k, v in flags.items() if v is not None}
    token = _yaml_path.set(str(path) if path is not None else None)
    try:
        return ServerSettings(**given)
    finally:
        _yaml_path.reset(token)
