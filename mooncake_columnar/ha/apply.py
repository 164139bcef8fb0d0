"""Apply oplog batches to a standby's state (a MasterService used as a container, never serving).

A batch is applied as columns, strictly in sequence order: segment entries (rare) one by one, and
each maximal run of object entries between them vectorized. Within a run only the last op of each
(tenant, key) matters (PUT_END carries the whole descriptor, REMOVE deletes), so the run becomes
one batch delete of the keys it names plus one batch insert of their last PUT_ENDs. No deadline
is ever read from an entry: applied objects hold NEVER_LEASED / NO_DEADLINE (RFC Phase 1).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from numba import njit

from ..errors import OpLogError
from ..schema import KIND_MEMORY, NEVER_LEASED, NO_DEADLINE, OBJECTS_ARROW_SCHEMA, REPLICAS_ARROW_SCHEMA
from ..store.arrow_io import append_objects
from ..store.keys import string_buffers
from ..store.segments import Segment
from .oplog import OpLogBatch, OpLogColumns, OpType, SegmentPayload

if TYPE_CHECKING:
    from ..master import MasterService

# Standby segments have no client-side base until their client remounts; any nonzero value will
# do because replicas are kept as offsets inside the segment.
STANDBY_SEGMENT_BASE = 1
_PUT_END = np.uint8(OpType.PUT_END)
_I64_MAX = np.uint64(2**63 - 1)


def apply_batch(m: "MasterService", batch: OpLogBatch) -> None:
    """Apply ``batch`` in order. Raises OpLogError (fail closed) on an entry that cannot be
    applied, e.g. a replica on a segment the standby never saw mounted."""
    cols = batch.columns
    start = 0
    for payload, row in zip(cols.segments, cols.segment_rows.tolist()):
        _apply_objects(m, cols.slice(start, row))
        _apply_segment(m, batch.first_sequence_id + row, OpType(int(cols.op[row])), payload)
        start = row + 1
    _apply_objects(m, cols.slice(start, len(cols)))


def _apply_segment(m: "MasterService", seq: int, op: OpType, p: SegmentPayload) -> None:
    if op == OpType.SEGMENT_MOUNT:
        existing = m.segments.get(p.name)
        if existing is not None:
            if (existing.endpoint, existing.size, existing.client) != (p.endpoint, p.capacity, p.client):
                raise OpLogError(f"entry {seq}: SEGMENT_MOUNT {p.name!r} conflicts with the mounted one")
            return
        m.segments.mount(Segment(p.name, p.endpoint, p.client, STANDBY_SEGMENT_BASE, p.capacity), readable=False)
    else:
        code = m.segments.code(p.name)
        if code >= 0:
            m._unmount_codes([code])


@njit(cache=True)
def _last_of_each_key(tenants: np.ndarray, offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Mask of the rows that are the last occurrence of their (tenant code, key bytes): one pass
    from the end with an open-addressing table of rows (FNV-1a over tenant and bytes)."""
    n = tenants.shape[0]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    slots = np.full(cap, -1, np.int64)
    last = np.zeros(n, np.bool_)
    for i in range(n - 1, -1, -1):
        s, e = offsets[i], offsets[i + 1]
        h = np.uint64(14695981039346656037) ^ np.uint64(tenants[i] & 0xFFFFFFFF)
        for b in range(s, e):
            h = (h ^ np.uint64(data[b])) * np.uint64(1099511628211)
        j = np.int64(h & np.uint64(cap - 1))
        while True:
            r = slots[j]
            if r < 0:
                slots[j] = i
                last[i] = True
                break
            rs, re = offsets[r], offsets[r + 1]
            if tenants[r] == tenants[i] and re - rs == e - s:
                same = True
                for k in range(e - s):
                    if data[s + k] != data[rs + k]:
                        same = False
                        break
                if same:
                    break  # a later row already holds this key
            j = (j + 1) & (cap - 1)
    return last


def _apply_objects(m: "MasterService", run: OpLogColumns) -> None:
    """One run of PUT_END / REMOVE rows: validate, delete every key it names, insert the last
    PUT_END of each key. Nothing is mutated when validation fails."""
    if len(run) == 0:
        return
    last = _last_of_each_key(run.tenant, run.key_offsets, run.key_bytes)
    # engine code of each tenant string (-1: never interned, so no object to delete); per distinct tenant
    engine_tenant = np.full(len(run.strings), -1, np.int32)
    used = np.unique(run.tenant)
    engine_tenant[used] = [m.tenants.find(t) for t in run.strings.take(pa.array(used)).to_pylist()]
    puts = np.flatnonzero(last & (run.op == _PUT_END))
    p = run.put_prefix[puts]  # their index into the PUT_END columns
    starts, counts = run.replica_starts[p], run.replica_count[p].astype(np.int64)
    reps = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
    _check_puts(m, run, p, reps)

    keys = run.keys
    tenants = engine_tenant[run.tenant]
    if not last.all():  # each key once: the rows found are then distinct
        named = np.flatnonzero(last)
        keys, tenants = keys.take(pa.array(named)), tenants[named]
    offsets, data = string_buffers(keys)
    found = m.keys.lookup_batch(offsets, data, tenants)
    m._erase_rows(found[found >= 0])
    if puts.size:
        append_objects(m, *_tables(run, puts, p, reps, counts))
        ids = run.replica_id[reps]
        if ids.size:
            m.next_replica_id = max(m.next_replica_id, int(ids.max()) + 1)


def _check_puts(m: "MasterService", run: OpLogColumns, p: np.ndarray, reps: np.ndarray) -> None:
    """What the engine cannot hold: sizes and offsets past int64, memory replicas on segments
    this standby never saw mounted."""
    for name, values in (("size", run.size[p]), ("replica_size", run.replica_size[reps]),
                         ("replica_offset", run.replica_offset[reps])):
        if values.size and values.max() > _I64_MAX:
            raise OpLogError(f"PUT_END {name} {int(values.max())} does not fit the engine's int64")
    memory = reps[run.replica_kind[reps] == KIND_MEMORY]
    codes = np.unique(run.replica_segment[memory])
    for code, name in zip(codes.tolist(), run.strings.take(pa.array(codes)).to_pylist()):  # per distinct segment
        if m.segments.code(name) < 0:
            rid = run.replica_id[memory[run.replica_segment[memory] == code][0]]
            raise OpLogError(f"PUT_END replica {int(rid)} is on unknown segment {name!r}")


def _tables(run: OpLogColumns, puts: np.ndarray, p: np.ndarray, reps: np.ndarray,
            counts: np.ndarray) -> tuple[pa.Table, pa.Table]:
    """The objects and replicas tables of ``append_objects`` for the selected PUT_END rows."""
    n = puts.size
    strings = run.strings.cast(pa.string())

    def text(codes: np.ndarray) -> pa.Array:
        return strings.take(pa.array(codes))

    keys = run.keys if n == len(run) else run.keys.take(pa.array(puts))
    objects = pa.table({
        "tenant": text(run.tenant[puts]),
        "key": keys.cast(pa.string()),
        "client": text(run.client[p]),
        "size_bytes": run.size[p].astype(np.int64),
        "data_type": run.data_type[p],
        "group": text(run.group[p]),
        "hard_pinned": run.hard_pinned[p],
        "soft_pin_enabled": run.soft_pin_enabled[p],
        "lease_deadline_ns": np.full(n, NEVER_LEASED, np.int64),
        "soft_pin_deadline_ns": np.full(n, NO_DEADLINE, np.int64),
        "put_start_time_ms": np.zeros(n, np.int64),
        "processing": np.zeros(n, np.bool_),
        "replica_count": counts.astype(np.int32),
    }, schema=OBJECTS_ARROW_SCHEMA)
    replicas = pa.table({
        "object_index": np.repeat(np.arange(n, dtype=np.int64), counts),
        "replica_id": run.replica_id[reps],
        "kind": run.replica_kind[reps],
        "status": run.replica_status[reps],
        "segment": text(run.replica_segment[reps]),
        "offset": run.replica_offset[reps].astype(np.int64),
        "size": run.replica_size[reps].astype(np.int64),
        "readable": np.zeros(reps.size, np.bool_),
    }, schema=REPLICAS_ARROW_SCHEMA)
    return objects, replicas
