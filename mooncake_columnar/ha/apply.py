"""Apply oplog entries to a standby's state (a MasterService used as a container, never serving).

Object entries are applied per run between segment entries, vectorized: within a run only the
last op of each (tenant, key) matters (PUT_END carries the whole descriptor, REMOVE deletes), so
the run becomes one batch delete plus one batch insert. No deadline is ever read from an entry:
applied objects hold NEVER_LEASED / NO_DEADLINE (RFC Phase 1: deadlines never cross the wire).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa

from ..errors import OpLogError
from ..schema import NEVER_LEASED, NO_DEADLINE, OBJECTS_ARROW_SCHEMA, REPLICAS_ARROW_SCHEMA, KIND_MEMORY
from ..store.arrow_io import append_objects
from ..store.keys import as_string_array, string_buffers
from ..store.segments import Segment
from .oplog import OpLogEntry, OpType, PutEndPayload

if TYPE_CHECKING:
    from ..master import MasterService

# Standby segments have no client-side base until their client remounts; any nonzero value will
# do because replicas are kept as offsets inside the segment.
STANDBY_SEGMENT_BASE = 1


def apply_entries(m: "MasterService", entries: Sequence[OpLogEntry]) -> None:
    """Apply contiguous entries in order. Raises OpLogError (fail closed) on an entry that
    cannot be applied, e.g. a replica on a segment the standby never saw mounted."""
    run: list[OpLogEntry] = []
    for e in entries:
        if e.op in (OpType.PUT_END, OpType.REMOVE):
            run.append(e)
            continue
        _apply_objects(m, run)
        run = []
        _apply_segment(m, e)
    _apply_objects(m, run)


def _apply_segment(m: "MasterService", e: OpLogEntry) -> None:
    p = e.payload
    if e.op == OpType.SEGMENT_MOUNT:
        existing = m.segments.get(p.name)
        if existing is not None:
            if (existing.endpoint, existing.size, existing.client) != (p.endpoint, p.capacity, p.client):
                raise OpLogError(f"entry {e.sequence_id}: SEGMENT_MOUNT {p.name!r} conflicts with the mounted one")
            return
        m.segments.mount(Segment(p.name, p.endpoint, p.client, STANDBY_SEGMENT_BASE, p.capacity), readable=False)
    else:
        code = m.segments.code(p.name)
        if code >= 0:
            m._unmount_codes([code])


def _apply_objects(m: "MasterService", run: list[OpLogEntry]) -> None:
    if not run:
        return
    last: dict[tuple[str, str], OpLogEntry] = {}
    for e in run:  # the entries are Python objects already: one dict pass, then vectorized work
        last[(e.tenant, e.key)] = e
    by_tenant: dict[str, list[str]] = {}
    for tenant, key in last:
        by_tenant.setdefault(tenant, []).append(key)
    for tenant, keys in by_tenant.items():  # one iteration per tenant
        offsets, data = string_buffers(as_string_array(keys))
        rows = m._lookup(offsets, data, tenant)
        m._erase_rows(rows[rows >= 0])
    puts = [e for e in last.values() if e.op == OpType.PUT_END]
    if puts:
        objects, replicas = _tables(m, puts)
        append_objects(m, objects, replicas)


def _tables(m: "MasterService", puts: list[OpLogEntry]) -> tuple[pa.Table, pa.Table]:
    n = len(puts)
    payloads: list[PutEndPayload] = [e.payload for e in puts]
    counts = np.array([len(p.replicas) for p in payloads], np.int64)
    reps = [r for p in payloads for r in p.replicas]
    for r in reps:
        if r.kind == int(KIND_MEMORY) and m.segments.code(r.segment) < 0:
            raise OpLogError(f"PUT_END replica {r.replica_id} is on unknown segment {r.segment!r}")
    objects = pa.table({
        "tenant": [e.tenant for e in puts],
        "key": [e.key for e in puts],
        "client": [p.client for p in payloads],
        "size_bytes": pa.array([p.size for p in payloads], pa.int64()),
        "data_type": pa.array([p.data_type for p in payloads], pa.uint8()),
        "group": [p.group_id for p in payloads],
        "hard_pinned": [p.hard_pinned for p in payloads],
        "soft_pin_enabled": [p.soft_pin_enabled for p in payloads],
        "lease_deadline_ns": np.full(n, NEVER_LEASED, np.int64),
        "soft_pin_deadline_ns": np.full(n, NO_DEADLINE, np.int64),
        "put_start_time_ms": np.zeros(n, np.int64),
        "processing": np.zeros(n, np.bool_),
        "replica_count": counts.astype(np.int32),
    }, schema=OBJECTS_ARROW_SCHEMA)
    replicas = pa.table({
        "object_index": np.repeat(np.arange(n, dtype=np.int64), counts),
        "replica_id": pa.array([r.replica_id for r in reps], pa.uint64()),
        "kind": pa.array([r.kind for r in reps], pa.uint8()),
        "status": pa.array([r.status for r in reps], pa.uint8()),
        "segment": [r.segment for r in reps],
        "offset": pa.array([r.offset for r in reps], pa.int64()),
        "size": pa.array([r.size for r in reps], pa.int64()),
        "readable": np.zeros(len(reps), np.bool_),
    }, schema=REPLICAS_ARROW_SCHEMA)
    if reps:
        m.next_replica_id = max(m.next_replica_id, max(r.replica_id for r in reps) + 1)
    return objects, replicas
