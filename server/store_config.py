"""The store that the server's settings describe: its tiers top to bottom with their options
(device, host slab in a memfd, LMDB disk, S3), leases, the pin quota and namespace limits, as a
:class:`~kvstore.config.StoreConfig`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvstore.config import StoreConfig, TierConfig
from kvstore.whatif import WhatIfConfig

if TYPE_CHECKING:
    from server.settings import ServerSettings


def pin_quota_of(s: ServerSettings, top: TierConfig) -> int:
    """Bytes one tenant may hold pinned: ``max_pinned_bytes_per_tenant``, or by default a
    quarter of the top tier, so that no one tenant's pins can hold more than a quarter of
    the tier that every put and promotion lands in. Only pins taken for a tenant (a tenant
    token) are charged; the admin's are not."""
    return s.max_pinned_bytes_per_tenant or max(1, top.capacity_bytes // 4)


def store_config_of(s: ServerSettings) -> StoreConfig:
    """Tiers top to bottom as configured; namespaces persist under the data dir."""
    tiers: list[TierConfig] = []
    if s.device_capacity:
        tiers.append(TierConfig("device", s.device_capacity, policy=s.policy,
                                options={"device": s.device}))
    if s.host_capacity:
        # memfd: no /dev/shm name; clients get the descriptor only from the data plane
        options: dict[str, Any] = {"shm_name": s.shm, "memfd": True}
        if s.host_slot_bytes:
            options["slot_bytes"] = s.host_slot_bytes
        tiers.append(TierConfig("host", s.host_capacity, policy=s.policy,
                                options=options))
    if s.disk_capacity:
        tiers.append(TierConfig("disk", s.disk_capacity, policy=s.policy,
                                write_through=s.disk_write_through,
                                options={"path": str(s.data_path / "lmdb")}))
    if s.s3_bucket:
        # what this node holds in S3 is catalogued under the data dir: a restart keeps it
        s3: dict[str, Any] = {"bucket": s.s3_bucket, "prefix": s.s3_prefix,
                              "catalog_path": str(s.data_path / "s3-catalog")}
        if s.s3_endpoint:
            s3["endpoint"] = s.s3_endpoint
        if s.s3_region:
            s3["region"] = s.s3_region
        tiers.append(TierConfig("s3", s.s3_capacity, policy=s.policy, options=s3))
    return StoreConfig(
        tiers=tuple(tiers),
        default_lease_s=min(s.lease_s, s.max_lease_s),  # cut like every lease
        max_lease_s=s.max_lease_s,
        max_pinned_bytes_per_tenant=pin_quota_of(s, tiers[0]),
        namespaces_path=str(s.data_path / "namespaces.json"),
        max_namespaces=s.max_namespaces,
        max_namespaces_per_tenant=s.max_namespaces_per_tenant,
        ghost_entries=s.ghost_entries,
        background_demotion=s.background_demotion,
        max_prefetch_blocks=s.max_prefetch_blocks,
        whatif=WhatIfConfig(sample_rate=s.whatif_sample_rate, max_keys=s.whatif_max_keys,
                            policies=tuple(s.whatif_policies))
        if s.whatif_sample_rate > 0 else None,
    )
