"""Request and response types of the MasterService API."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from .schema import ObjectDataType, ReplicaKind, ReplicaStatus, SoftPinAction

DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class ReplicateConfig:
    """Upstream ReplicateConfig (plus the tenant, which upstream passes beside it)."""

    replica_num: int = 1
    hard_pin: bool = False
    soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
    soft_pin_ttl_ms: int | None = None
    group_id: str = ""
    tenant_id: str = DEFAULT_TENANT
    preferred_segments: tuple[str, ...] = ()
    data_type: ObjectDataType = ObjectDataType.UNKNOWN


class ReplicaDescriptor(NamedTuple):
    replica_id: int
    kind: ReplicaKind
    status: ReplicaStatus
    segment: str
    endpoint: str
    address: int      # segment base + offset
    size: int
    readable: bool


@dataclass(frozen=True)
class ObjectInfo:
    tenant: str
    key: str
    client: str
    size: int
    data_type: int
    group_id: str
    hard_pinned: bool
    soft_pin_enabled: bool
    lease_deadline_ns: int
    soft_pin_deadline_ns: int
    processing: bool
    put_start_time_ms: int
    replicas: tuple[ReplicaDescriptor, ...] = field(default_factory=tuple)
    object_checksum: int | None = None  # upstream's, for objects restored from an upstream snapshot


@dataclass(frozen=True)
class SegmentInfo:
    """One mounted segment (``MasterService.segment_info``). Two usage figures:
    ``used_bytes`` is exact, the sizes of the memory replicas on it (what upstream's
    QuerySegments reports: its allocator counts requested bytes); ``held_bytes`` is what the
    engine's allocator holds, each replica rounded up to the allocation unit
    (``allocation_unit`` bytes: 1 up to 3.75 GiB of capacity, 8 at 16 GiB, ...), and is what
    eviction's watermark counts. Both include replicas whose removal awaits durability and
    buffers of abandoned puts not yet released."""

    name: str
    segment_id: str
    host_id: str
    endpoint: str
    client: str
    base: int
    capacity: int
    used_bytes: int
    held_bytes: int
    allocation_unit: int
    readable: bool


@dataclass(frozen=True)
class BatchResult:
    """Per-key int32 error codes (0 = OK) and, where the call returns replicas, a flat table.

    ``replicas`` columns: key_index (position in the request), replica_id, segment, endpoint
    (both dictionary-encoded strings), address, size.
    """

    codes: np.ndarray
    replicas: pa.Table | None = None

    @property
    def ok(self) -> np.ndarray:
        return self.codes == 0
