"""Apply oplog batches to a standby's state (a MasterService used as a container, never serving).

A batch is applied as columns, strictly in sequence order: segment entries (rare) one by one, and
each maximal run of object entries between them vectorized. Within a run only the last op of each
(tenant, key) matters (PUT_END carries the whole descriptor, REMOVE deletes), so the run becomes
one batch delete of the keys it names plus one batch insert of their last PUT_ENDs, straight into
the store (``MetadataStore.insert_objects``, which a restore uses too). No deadline is ever read
from an entry: applied objects hold NEVER_LEASED / NO_DEADLINE (RFC Phase 1).

Before a run mutates anything, its inserts are validated on their columns by the checks a
snapshot state's go through (:mod:`..store.snapshot_state`: every field in its domain, extents inside
their segments and unit-aligned) and their extents are taken from the segments' free lists,
which apply keeps exact on the standby (the engine's frees skip segments that take no
allocations): an extent that overlaps one the standby already holds, or another of the run, is
refused, typed (:class:`~mooncake_columnar.errors.OpLogInvalidEntry`, naming the entry), and the
standby is left as it was before the run. Likewise a replica id that another object holds (the
standby's replica-id index, :mod:`..store.replica_ids`, less the ids of the objects the run erases or
replaces) or that two inserts of the run share. Apply keeps that index exact: every path by which it
changes the held replicas (the run's erase and insert, a segment unmount) updates it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..kernels.jit import njit
from ..errors import EngineInvariantError, OpLogError, OpLogInvalidEntry, SnapshotFieldError
from ..kernels import allocation as ak
from ..kernels import hashing as hk
from ..kernels import id_set
from ..schema import (FLAG_HARD_PINNED, FLAG_LIVE, FLAG_SOFT_PIN_ENABLED, KIND_MEMORY, NEVER_LEASED, NO_DEADLINE,
                      ST_COMPLETE, ST_EMPTY)
from ..store.inserts import NewObjects
from ..store.keys import string_buffers
from ..store.replica_ids import ReplicaIdIndex, held_ids
from ..store.segments import Segment, segments_table
from ..store.snapshot_state import check_next_id, check_object_columns, check_replica_columns, check_segments
from .oplog import OpLogBatch, OpLogColumns, OpType, SegmentPayload

if TYPE_CHECKING:
    from ..master import MasterService

# Standby segments have no client-side base until their client remounts; any nonzero value will
# do because replicas are kept as offsets inside the segment.
STANDBY_SEGMENT_BASE = 1
_PUT_END = np.uint8(OpType.PUT_END)
_I64_MAX = 2**63 - 1


def apply_batch(m: "MasterService", batch: OpLogBatch) -> None:
    """Apply ``batch`` in order. Raises OpLogError (fail closed) on an entry that cannot be
    applied, e.g. a replica on a segment the standby never saw mounted."""
    ids = replica_id_index(m)
    cols, first = batch.columns, batch.first_sequence_id
    start = 0
    for payload, row in zip(cols.segments, cols.segment_rows.tolist()):
        _apply_objects(m, ids, cols.slice(start, row), first + start)
        _apply_segment(m, ids, first + row, OpType(int(cols.op[row])), payload)
        start = row + 1
    _apply_objects(m, ids, cols.slice(start, len(cols)), first + start)


def replica_id_index(m: "MasterService") -> ReplicaIdIndex:
    """The container's replica-id index; built from its columns on first use (the standby builds
    it when it loads its container: this serves containers made elsewhere, e.g. by tests)."""
    if m.standby_replica_ids is None:
        m.standby_replica_ids = ReplicaIdIndex.of_master(m)
    return m.standby_replica_ids


def _apply_segment(m: "MasterService", ids: ReplicaIdIndex, seq: int, op: OpType, p: SegmentPayload) -> None:
    if op == OpType.SEGMENT_MOUNT:
        if not 1 <= p.capacity <= _I64_MAX - STANDBY_SEGMENT_BASE:  # base + size within int64
            raise OpLogInvalidEntry("capacity", f"SEGMENT_MOUNT {p.name!r} capacity {p.capacity} is outside "
                                    f"[1, 2**63 - 1 - {STANDBY_SEGMENT_BASE}]", seq)
        existing = m.segments.get(p.name)
        holder = m.segments.code_of_id(p.segment_id) if p.segment_id else -1
        if holder >= 0 and m.segments.info[holder].name != p.name:
            raise OpLogInvalidEntry("segment_id", f"SEGMENT_MOUNT {p.name!r}: segment id {p.segment_id!r} "
                                    f"is mounted as {m.segments.info[holder].name!r}", seq)
        if existing is not None:
            if (existing.endpoint, existing.size, existing.client) != (p.endpoint, p.capacity, p.client):
                raise OpLogError(f"entry {seq}: SEGMENT_MOUNT {p.name!r} conflicts with the mounted one")
            if p.segment_id:  # a remount after promotion tells the client's real segment id
                m.segments.replace_info(m.segments.code(p.name), replace(
                    existing, segment_id=p.segment_id, host_id=p.host_id or existing.host_id))
            return
        m.segments.mount(Segment(p.name, p.endpoint, p.client, STANDBY_SEGMENT_BASE, p.capacity,
                                 p.segment_id, p.host_id), readable=False)
    else:
        code = m.segments.code(p.name)
        if code >= 0:
            o = m.objects
            dropped = o.replica_id[:o.high_water][o.memory_slots_on(code)]  # the slots the unmount drops
            m.store.unmount_segment(code)
            ids.replace(dropped, dropped[:0])


def _apply_objects(m: "MasterService", ids: ReplicaIdIndex, run: OpLogColumns, seq0: int) -> None:
    """One run of PUT_END / REMOVE rows (row i is sequence id ``seq0 + i``): validate, delete
    every key it names, insert the last PUT_END of each key. Nothing is mutated when validation
    fails."""
    if len(run) == 0:
        return
    last = hk.last_of_each_key(run.key_offsets, run.key_bytes, run.tenant)
    # engine code of each tenant string (-1: never interned, so no object to delete); per distinct tenant
    engine_tenant = np.full(len(run.strings), -1, np.int32)
    used = np.unique(run.tenant)
    engine_tenant[used] = [m.tenants.find(t) for t in run.strings.take(pa.array(used)).to_pylist()]
    puts = np.flatnonzero(last & (run.op == _PUT_END))
    p = run.put_prefix[puts]  # their index into the PUT_END columns
    starts, counts = run.replica_starts[p], run.replica_count[p].astype(np.int64)
    reps = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
    rep_put = np.repeat(np.arange(puts.size), counts)  # each replica's index into puts
    _check_puts(m, run, puts, p, reps, rep_put, seq0)
    if puts.size:
        _validate_puts(m, run, puts, p, reps, rep_put, counts, seq0)

    keys = run.keys
    tenants = engine_tenant[run.tenant]
    if not last.all():  # each key once: the rows found are then distinct
        named = np.flatnonzero(last)
        keys, tenants = keys.take(pa.array(named)), tenants[named]
    offsets, data = string_buffers(keys)
    found = m.keys.lookup_batch(offsets, data, tenants)
    erased = found[found >= 0]
    freed, new_ids, rep_seq = held_ids(m.objects, erased), run.replica_id[reps], puts[rep_put] + seq0
    _check_ids_free(ids, freed, new_ids, rep_seq)
    free_lists = _take_extents(m, erased, run, reps, rep_seq)
    m.store.erase_rows(erased)  # from here on nothing raises: every check above passed
    for code, (st, ln) in free_lists.items():
        m.segments.install_allocator(code, st, ln, int(m.segments.capacity[code]) - int(ln.sum()))
    if puts.size:
        m.store.insert_objects(_new_objects(m, run, puts, p, reps, rep_put))
        if new_ids.size:
            m.store.next_replica_id = max(m.store.next_replica_id, int(new_ids.max()) + 1)
    ids.replace(freed, new_ids)


def _check_puts(m: "MasterService", run: OpLogColumns, puts: np.ndarray, p: np.ndarray, reps: np.ndarray,
                rep_put: np.ndarray, seq0: int) -> None:
    """What the engine cannot hold: sizes, offsets and ids past int64 (an id must leave room for
    the next one), replicas that are not COMPLETE (a put is journaled when it ends), memory
    replicas on segments this standby never saw mounted."""
    for name, values, limit, rows in (("size", run.size[p], _I64_MAX, puts),
                                      ("replica_size", run.replica_size[reps], _I64_MAX, puts[rep_put]),
                                      ("replica_offset", run.replica_offset[reps], _I64_MAX, puts[rep_put]),
                                      ("replica_id", run.replica_id[reps], _I64_MAX - 1, puts[rep_put])):
        if values.size and int(values.max()) > limit:
            i = int(np.argmax(values > np.uint64(limit)))
            raise OpLogInvalidEntry(name, f"PUT_END {name} {int(values[i])} is above {limit} (int64)",
                                    seq0 + int(rows[i]))
    incomplete = run.replica_status[reps] != ST_COMPLETE
    if incomplete.any():
        i = int(np.argmax(incomplete))
        raise OpLogInvalidEntry("replica_status", f"PUT_END replica status {int(run.replica_status[reps[i]])} "
                                "is not COMPLETE", seq0 + int(puts[rep_put[i]]))
    memory = np.flatnonzero(run.replica_kind[reps] == KIND_MEMORY)
    codes = np.unique(run.replica_segment[reps[memory]])
    for code, name in zip(codes.tolist(), run.strings.take(pa.array(codes)).to_pylist()):  # per distinct segment
        if m.segments.code(name) < 0:
            i = int(memory[np.argmax(run.replica_segment[reps[memory]] == code)])
            raise OpLogInvalidEntry("replica_segment", f"PUT_END replica {int(run.replica_id[reps[i]])} is on "
                                    f"unknown segment {name!r}", seq0 + int(puts[rep_put[i]]))


def _check_ids_free(ids: ReplicaIdIndex, freed: np.ndarray, new_ids: np.ndarray, rep_seq: np.ndarray) -> None:
    """Replica ids are unique among held replicas: a new one may be any id no object holds once
    the run's erased objects (``freed``: the ids they held) are gone, whatever its order against
    the next id (PUT_ENDs arrive in the order puts end). ``rep_seq``: each id's sequence id."""
    k, why = ids.first_taken(new_ids, freed)
    if k >= 0:
        what = "held by another object" if why == id_set.TAKEN_HELD else "used twice in this batch"
        raise OpLogInvalidEntry("replica_id", f"PUT_END replica id {int(new_ids[k])} is {what}", int(rep_seq[k]))


def _validate_puts(m: MasterService, run: OpLogColumns, puts: np.ndarray, p: np.ndarray, reps: np.ndarray,
                   rep_put: np.ndarray, counts: np.ndarray, seq0: int) -> None:
    """The run's objects and replicas checked as a snapshot state's are, on their columns,
    against the standby's segments (:mod:`..store.snapshot_state`: every field in its domain, extents
    inside their segments and on their units, ids unique...): a SnapshotFieldError becomes
    OpLogInvalidEntry naming the entry. Overlaps are left to _take_extents, which carves every
    new extent out of free space."""
    ids = run.replica_id[reps]
    segment, names = _distinct(run, run.replica_segment[reps])
    size = run.size[p].astype(np.int64)
    try:
        next_id = check_next_id(max(m.next_replica_id, int(ids.max()) + 1 if ids.size else 1))
        check_object_columns(size, run.put_start_time_ms[p].astype(np.int64), np.diff(run.key_offsets)[puts])
        check_segments(_segments_table(m))
        check_replica_columns({"object_index": rep_put, "replica_id": ids, "kind": run.replica_kind[reps],
                               "status": run.replica_status[reps],
                               "offset": run.replica_offset[reps].astype(np.int64),
                               "size": run.replica_size[reps].astype(np.int64)},
                              segment, names, np.array([m.segments.code(n) for n in names], np.int64),
                              counts.astype(np.int32), size, m.segments.capacity, m.segments.unit_bits, next_id)
    except SnapshotFieldError as e:
        obj = (None if e.row is None else e.row if e.table == "objects"
               else int(rep_put[e.row]) if e.table == "replicas" else None)
        raise OpLogInvalidEntry(e.field, f"PUT_END: {e}", None if obj is None else seq0 + int(puts[obj])) from e


def _segments_table(m: "MasterService") -> pa.Table:
    """The mounted segments as a snapshot segments table (few rows)."""
    s = m.segments
    codes = [c for c, info in enumerate(s.info) if info is not None]
    return segments_table([s.info[c] for c in codes], s.used[codes], s.readable[codes])


def _take_extents(m: "MasterService", erased: np.ndarray, run: OpLogColumns, reps: np.ndarray,
                  rep_seq: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The free list of every segment the run touches once the erased rows' extents are freed and
    the new memory extents (replicas ``reps`` of the run, checked already) taken: code ->
    (starts, lengths); nothing is changed here. Raises OpLogInvalidEntry naming the entry
    (``rep_seq``: each replica's sequence id) whose extent is not entirely free: it overlaps an
    extent the standby holds or another one of the run."""
    o, s = m.objects, m.segments
    r_idx, slot = np.nonzero((o.replica_status[erased] != ST_EMPTY) & (o.replica_kind[erased] == KIND_MEMORY))
    old_rows = erased[r_idx]
    old_seg = o.replica_segment[old_rows, slot].astype(np.int64)
    old_off, old_size = s.byte_offsets(o.replica_offset[old_rows, slot], KIND_MEMORY, old_seg), o.size_bytes[old_rows]
    memory = np.flatnonzero(run.replica_kind[reps] == KIND_MEMORY)
    names, inverse = np.unique(run.replica_segment[reps[memory]], return_inverse=True)
    codes = np.array([s.code(n) for n in run.strings.take(pa.array(names)).to_pylist()], np.int64)  # per segment
    new_seg = codes[inverse] if memory.size else np.zeros(0, np.int64)
    new_off = run.replica_offset[reps[memory]].astype(np.int64)
    new_size = run.replica_size[reps[memory]].astype(np.int64)
    touched = np.unique(np.concatenate((old_seg, new_seg)))
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for code in touched.tolist():  # one iteration per segment
        unit, cap = s.unit_bits[code], s.capacity[code]
        st, ln = s.extents.of(code)
        freed = old_seg == code
        if freed.any():  # the erased rows' held extents join the free list (coalesced)
            ends = ak.held_end(old_off[freed], old_size[freed], unit, cap)
            a, e = np.concatenate((st, old_off[freed])), np.concatenate((st + ln, ends))
            order = np.argsort(a, kind="stable")
            a, e = a[order], e[order]
            if (a[1:] < e[:-1]).any():
                raise EngineInvariantError("free_list", f"segment {s.info[code].name!r}: an erased replica's "
                                                        "extent is already free on the standby")
            first = np.concatenate(([True], a[1:] != e[:-1]))  # first extent of each coalesced run
            st, ln = a[first], e[np.concatenate((first[1:], [True]))] - a[first]
        taken = np.flatnonzero(new_seg == code)
        taken = taken[np.argsort(new_off[taken], kind="stable")]
        ends = ak.held_end(new_off[taken], new_size[taken], unit, cap)
        st, ln, k, bad = _carve(np.ascontiguousarray(st), np.ascontiguousarray(ln), st.size, new_off[taken], ends)
        if bad >= 0:
            raise OpLogInvalidEntry("replica_offset", f"PUT_END extent [{int(new_off[taken[bad]])}, {int(ends[bad])}) "
                                    f"on segment {s.info[code].name!r} overlaps an extent the standby holds "
                                    "or another one of this batch",
                                    int(rep_seq[memory[taken[bad]]]))
        out[code] = (st[:k], ln[:k])
    return out


@njit(cache=True)
def _carve(st, ln, n, offs, ends):
    """Free extents [st, st + ln)[:n] (sorted, disjoint) minus the extents [offs, ends) (sorted by
    offset): (starts, lengths, count, -1), or (..., j) when extent j is not entirely free."""
    m = offs.shape[0]
    out_st = np.empty(n + m + 1, np.int64)
    out_ln = np.empty(n + m + 1, np.int64)
    k = 0
    i = 0
    a = np.int64(0)  # the free piece being cut: [a, b)
    b = np.int64(0)
    for j in range(m):
        o, e = offs[j], ends[j]
        while b <= o:  # this piece ends before the extent starts: keep it, take the next
            if b > a:
                out_st[k] = a
                out_ln[k] = b - a
                k += 1
            if i == n:
                return out_st, out_ln, k, j
            a, b = st[i], st[i] + ln[i]
            i += 1
        if o < a or e > b:
            return out_st, out_ln, k, j
        if o > a:
            out_st[k] = a
            out_ln[k] = o - a
            k += 1
        a = e
    if b > a:
        out_st[k] = a
        out_ln[k] = b - a
        k += 1
    while i < n:
        out_st[k] = st[i]
        out_ln[k] = ln[i]
        k += 1
        i += 1
    return out_st, out_ln, k, -1


def _distinct(run: OpLogColumns, codes: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(codes, names) of the strings ``run.strings[codes]``: ``names`` the distinct ones in order
    of first appearance (as a column's dictionary encoding has them), codes into it."""
    used, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[inverse], run.strings.take(pa.array(used[order])).to_pylist()


def _new_objects(m: MasterService, run: OpLogColumns, puts: np.ndarray, p: np.ndarray, reps: np.ndarray,
                 rep_put: np.ndarray) -> NewObjects:
    """The selected PUT_END rows as the store's columns (names interned): never leased, no
    soft-pin deadline, not in flight (RFC Phase 1)."""
    s = m.store
    n = puts.size
    tenant = s.tenants.codes(*_distinct(run, run.tenant[puts]))
    keys = run.keys if n == len(run) else run.keys.take(pa.array(puts))
    offsets, data = string_buffers(keys)
    flags = (FLAG_LIVE | np.where(run.hard_pinned[p], FLAG_HARD_PINNED, 0)
             | np.where(run.soft_pin_enabled[p], FLAG_SOFT_PIN_ENABLED, 0)).astype(np.uint8)
    kind = run.replica_kind[reps]
    return NewObjects(
        tenant=tenant, key_offsets=offsets, key_data=data, client=s.clients.codes(*_distinct(run, run.client[p])),
        group=s.group_codes(tenant, *_distinct(run, run.group[p])), size_bytes=run.size[p].astype(np.int64),
        data_type=run.data_type[p], flags=flags, lease_deadline_ns=np.full(n, NEVER_LEASED, np.int64),
        soft_pin_deadline_ns=np.full(n, NO_DEADLINE, np.int64),
        put_start_ms=run.put_start_time_ms[p].astype(np.int64), replica_object=rep_put,
        replica_segment=s.replica_locations(kind, *_distinct(run, run.replica_segment[reps])), replica_kind=kind,
        replica_status=run.replica_status[reps], replica_offset=run.replica_offset[reps].astype(np.int64),
        replica_id=run.replica_id[reps])
