"""MasterConfig: one frozen, validated configuration with upstream names and defaults."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidConfig

# Upper bound for any TTL in ms: keeps every `now + ttl` far from int64 overflow in ns.
MAX_TTL_MS = 100 * 365 * 24 * 3600 * 1000


def _require(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise InvalidConfig(name, message)


def _int_field(obj: Any, name: str, lo: int = 0, hi: int = MAX_TTL_MS) -> None:
    v = getattr(obj, name)
    _require(isinstance(v, int) and not isinstance(v, bool), name, f"must be an int, got {type(v).__name__}")
    _require(lo <= v <= hi, name, f"must be in [{lo}, {hi}], got {v}")


def _ratio_field(obj: Any, name: str) -> None:
    v = getattr(obj, name)
    _require(isinstance(v, (int, float)) and not isinstance(v, bool), name, "must be a number")
    _require(0.0 <= float(v) <= 1.0, name, f"must be in [0, 1], got {v}")


@dataclass(frozen=True)
class MasterConfig:
    default_kv_lease_ttl_ms: int = 10_000
    default_kv_soft_pin_ttl_ms: int = 1_800_000
    max_kv_soft_pin_ttl_ms: int = 86_400_000
    allow_evict_soft_pinned_objects: bool = True
    eviction_ratio: float = 0.05
    eviction_high_watermark_ratio: float = 0.90
    put_start_discard_timeout_s: int = 30
    put_start_release_timeout_s: int = 600
    client_live_ttl_s: int = 10
    enable_multi_tenants: bool = False
    recovery_kv_lease_ttl_ms: int | None = None
    # Largest replica_num a put may ask for (1..64). Replica slots are columns of every object:
    # once one object holds k replicas, every object pays k x 24 bytes until the next restart.
    max_replica_num: int = 4
    # HA primary: how long a change waits for oplog window space before it is refused
    # (UNAVAILABLE_IN_CURRENT_STATUS, nothing changed). The master lock is held meanwhile.
    oplog_admission_timeout_ms: int = 50
    # Restore: the most bytes one payload file of an upstream (v1) snapshot may decompress to
    # (each zstd frame is also capped at 64x its stored size); a candidate past it is refused.
    snapshot_max_decompressed_bytes: int = 4 << 30
    # Offload-on-evict (upstream names; effective only with enable_offload).
    enable_offload: bool = False
    offload_on_evict: bool = False
    offload_force_evict: bool = False
    offloading_queue_limit: int = 50_000
    # Refuse (InvalidParams) a client id that is not upstream's UUID string "<u64>-<u64>" at
    # mount, remount and put_start. A v1 rollback snapshot can only name clients by such ids, so a
    # master meant to be rolled back to upstream turns this on and learns of a bad id at once
    # rather than when the rollback snapshot is written (which then refuses, typed).
    require_upstream_client_ids: bool = False
    # Per-tenant memory quota in bytes (multi-tenant mode); tenants absent here are unregistered.
    tenant_quota_bytes: dict = field(default_factory=dict, hash=False, compare=True)

    def __post_init__(self) -> None:
        for name in ("default_kv_lease_ttl_ms", "default_kv_soft_pin_ttl_ms", "max_kv_soft_pin_ttl_ms"):
            _int_field(self, name)
        _require(self.default_kv_soft_pin_ttl_ms <= self.max_kv_soft_pin_ttl_ms, "default_kv_soft_pin_ttl_ms",
                 "must not exceed max_kv_soft_pin_ttl_ms")
        _ratio_field(self, "eviction_ratio")
        _ratio_field(self, "eviction_high_watermark_ratio")
        _int_field(self, "put_start_discard_timeout_s", 0, MAX_TTL_MS // 1000)
        _int_field(self, "put_start_release_timeout_s", 0, MAX_TTL_MS // 1000)
        _require(self.put_start_release_timeout_s > self.put_start_discard_timeout_s, "put_start_release_timeout_s",
                 "must be greater than put_start_discard_timeout_s")
        _int_field(self, "client_live_ttl_s", 1, MAX_TTL_MS // 1000)
        if self.recovery_kv_lease_ttl_ms is not None:
            _int_field(self, "recovery_kv_lease_ttl_ms")
        _int_field(self, "offloading_queue_limit", 1, 100_000_000)
        _int_field(self, "max_replica_num", 1, 64)
        _int_field(self, "oplog_admission_timeout_ms", 0, 60_000)
        _int_field(self, "snapshot_max_decompressed_bytes", 1, 1 << 40)
        for name in ("allow_evict_soft_pinned_objects", "enable_multi_tenants", "enable_offload",
                     "offload_on_evict", "offload_force_evict", "require_upstream_client_ids"):
            _require(isinstance(getattr(self, name), bool), name, "must be a bool")
        _require(isinstance(self.tenant_quota_bytes, dict), "tenant_quota_bytes", "must be a dict")
        for tenant, quota in self.tenant_quota_bytes.items():
            _require(isinstance(tenant, str) and tenant != "", "tenant_quota_bytes", f"bad tenant {tenant!r}")
            _require(isinstance(quota, int) and quota >= 0, "tenant_quota_bytes", f"bad quota for {tenant!r}")

    @property
    def effective_recovery_kv_lease_ttl_ms(self) -> int:
        """Recovery lease TTL granted at remount; defaults to the normal read lease TTL."""
        if self.recovery_kv_lease_ttl_ms is None:
            return self.default_kv_lease_ttl_ms
        return self.recovery_kv_lease_ttl_ms

    def replace(self, **changes: Any) -> "MasterConfig":
        return dataclasses.replace(self, **changes)
