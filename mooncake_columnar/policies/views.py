"""Read-only views of a master's store: object info, replica descriptors (single key and as
columns for a batch's Arrow table), segment usage."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..kernels import predicates as pk
from ..kernels import reads as rk
from ..messages import ObjectInfo, ReplicaDescriptor, SegmentInfo
from ..metrics import Metrics
from ..schema import (FLAG_HARD_PINNED, FLAG_PROCESSING, FLAG_SOFT_PIN_ENABLED, KIND_MEMORY, REPLICA_COLUMNS,
                      ST_EMPTY, ReplicaKind, ReplicaStatus)
from ..store.metadata import MetadataStore
from ..store.segments import byte_offsets

# int -> enum for the descriptors a single-key call builds (plain ints: no NumPy scalar per replica)
_KINDS = {int(k): k for k in ReplicaKind}
_STATUSES = {int(s): s for s in ReplicaStatus}
_COMPLETE = int(ReplicaStatus.COMPLETE)


def object_info(store: MetadataStore, row: int, key: str) -> ObjectInfo:
    """Deadlines (steady ns), flags and every replica with its readability of the object at ``row``."""
    o = store.objects
    f = int(o.flags[row])
    return ObjectInfo(
        tenant=store.tenants.name(int(o.tenant[row])), key=key,
        client=store.clients.name(int(o.client[row])), size=int(o.size_bytes[row]),
        data_type=int(o.data_type[row]), group_id=store.group_name(row),
        hard_pinned=bool(f & FLAG_HARD_PINNED), soft_pin_enabled=bool(f & FLAG_SOFT_PIN_ENABLED),
        lease_deadline_ns=int(o.lease_deadline_ns[row]),
        soft_pin_deadline_ns=int(store.soft_pins.get(np.array([row]))[0]),
        processing=bool(f & FLAG_PROCESSING),
        put_start_time_ms=int(o.put_start_ms(np.array([row]))[0]),
        replicas=tuple(descriptors(store, row, readable_only=False)),
        object_checksum=_object_checksum(store, row))


def _object_checksum(store: MetadataStore, row: int) -> int | None:
    o = store.objects
    i = int(np.searchsorted(o.checksum_rows, row))
    return int(o.checksum_values[i]) if i < o.checksum_rows.size and o.checksum_rows[i] == row else None


def segment_info(store: MetadataStore, metrics: Metrics) -> dict[str, SegmentInfo]:
    """name -> SegmentInfo of every mounted segment (see MasterService.segment_info)."""
    s, o = store.segments, store.objects
    hw = o.high_water
    memory = pk.memory_replica_mask(o.replica_status[:hw], o.replica_kind[:hw], o.replica_segment[:hw])
    r, j = np.nonzero(memory)
    n = len(s.info)
    d = store.discarded
    used = (np.bincount(o.replica_segment[r, j], weights=o.size_bytes[r], minlength=n)
            + np.bincount(d.seg, weights=d.size, minlength=n)).astype(np.int64)
    out = {}
    for c, seg in enumerate(s.info):
        if seg is None:
            continue
        out[seg.name] = SegmentInfo(seg.name, seg.segment_id, seg.host_id, seg.endpoint, seg.client, seg.base,
                                    seg.size, int(used[c]), int(s.used[c]), 1 << int(s.unit_bits[c]),
                                    bool(s.readable[c]))
        metrics.set("segment_used_bytes", float(used[c]), segment=seg.name)
        metrics.set("segment_held_bytes", float(s.used[c]), segment=seg.name)
    return out


def descriptors(store: MetadataStore, row: int, *, readable_only: bool) -> list[ReplicaDescriptor]:
    """Replica descriptors of the object at ``row`` (its row, then its continuation rows)."""
    if readable_only:
        return readable_descriptors(store, row)
    out: list[ReplicaDescriptor] = []
    more = store.objects.replica_more
    while row >= 0:  # the object's row, then its continuation rows (kernels/chains.py)
        _row_descriptors(store, row, readable_only, out)
        row = int(more[row]) if row < more.size else -1
    return out


def readable_descriptors(store: MetadataStore, row: int) -> list[ReplicaDescriptor]:
    """``descriptors(store, row, readable_only=True)``: the single-key get path. Plain ints
    from ``ndarray.item`` (no NumPy view or scalar per slot), and only COMPLETE slots looked
    at further (a readable replica is COMPLETE, whatever its kind)."""
    o = store.objects
    status, kinds, seg_col, ids, offsets, sizes = (o.replica_status, o.replica_kind, o.replica_segment,
                                                   o.replica_id, o.replica_offset, o.size_bytes)
    more = o.replica_more
    readable_mask = store.segments.readable
    info, unit_bits = store.segments.info, store.segments.unit_bits
    width = status.shape[1]
    out: list[ReplicaDescriptor] = []
    while row >= 0:  # the object's row, then its continuation rows (kernels/chains.py)
        for j in range(width):
            if status.item(row, j) != _COMPLETE:
                continue
            code = seg_col.item(row, j)
            kind = _KINDS[kinds.item(row, j)]
            if kind != ReplicaKind.MEMORY:  # LOCAL_DISK: the segment column holds the owner client
                out.append(ReplicaDescriptor(ids.item(row, j), kind, ReplicaStatus.COMPLETE, "",
                                             store.clients.name(code), 0, sizes.item(row), True))
            elif code >= 0 and readable_mask.item(code):  # kernels/predicates.is_readable_replica
                seg = info[code]
                out.append(ReplicaDescriptor(ids.item(row, j), kind, ReplicaStatus.COMPLETE, seg.name,
                                             seg.endpoint, seg.base + (offsets.item(row, j) << unit_bits.item(code)),
                                             sizes.item(row), True))
        row = more.item(row) if row < more.size else -1
    return out


def readable_disk_descriptor(store: MetadataStore, replica_id: int, kind: int, code: int,
                             size: int) -> ReplicaDescriptor:
    """The descriptor :func:`readable_descriptors` builds for a readable (so COMPLETE) slot of
    a kind other than MEMORY (LOCAL_DISK: ``code``, its segment column, holds the owner client);
    MasterService.get_replica_list builds a memory slot's itself."""
    return ReplicaDescriptor(replica_id, _KINDS[kind], ReplicaStatus.COMPLETE, "", store.clients.name(code), 0, size,
                             True)


def _row_descriptors(store: MetadataStore, row: int, readable_only: bool, out: list[ReplicaDescriptor]) -> None:
    o = store.objects
    statuses = o.replica_status[row].tolist()
    seg_codes = o.replica_segment[row].tolist()
    readable_mask = store.segments.readable
    for j, st in enumerate(statuses):
        if st == 0:
            continue
        code = seg_codes[j]
        kind = _KINDS[o.replica_kind[row, j]]
        if kind != ReplicaKind.MEMORY:  # LOCAL_DISK: the segment column holds the owner client
            if st == _COMPLETE or not readable_only:
                out.append(ReplicaDescriptor(int(o.replica_id[row, j]), kind, _STATUSES[st], "",
                                             store.clients.name(code), 0, int(o.size_bytes[row]),
                                             st == _COMPLETE))
            continue
        readable = bool(pk.readable_replica(st, kind, code, readable_mask))
        if readable_only and not readable:
            continue
        seg = store.segments.info[code]
        out.append(ReplicaDescriptor(int(o.replica_id[row, j]), kind, _STATUSES[st], seg.name, seg.endpoint,
                                     seg.base + (int(o.replica_offset[row, j]) << int(store.segments.unit_bits[code])),
                                     int(o.size_bytes[row]),
                                     readable))


def replica_columns(store: MetadataStore, batch_idx: np.ndarray, rows: np.ndarray,
                    key_base: int = 0) -> "ReplicaColumns":
    """Flat descriptors of every replica slot in use of rows[batch_idx] (key indices: batch_idx
    + ``key_base``), as NumPy gathers under the master lock; :func:`replica_table` builds the
    Arrow table from them later, outside it."""
    o = store.objects
    chains = o.chains(rows[batch_idx])
    ri, j = np.nonzero(o.replica_status[chains.rows] != ST_EMPTY)
    ki, r = batch_idx[chains.owner[ri]] + key_base, chains.rows[ri]
    names, endpoints, bases, unit_bits = _segment_lists(store)
    # non-memory replicas (LOCAL_DISK) map to the trailing "" entry
    seg_codes = np.where(o.replica_kind[r, j] == int(KIND_MEMORY), o.replica_segment[r, j], len(names) - 1)
    address = bases[seg_codes] + byte_offsets(o.replica_offset[r, j], unit_bits[seg_codes])
    return ReplicaColumns(ki, o.replica_id[r, j], seg_codes, names, endpoints, address, o.size_bytes[r])


def _segment_lists(store: MetadataStore) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """Names, endpoints, base addresses and allocation unit bits (what a memory replica's offset
    column is shifted by) by segment code, with a trailing ("", "", 0, 0) entry for the replicas
    on no segment (LOCAL_DISK)."""
    infos = store.segments.info
    names = [s.name if s else "" for s in infos] + [""]
    endpoints = [s.endpoint if s else "" for s in infos] + [""]
    bases = np.array([s.base if s else 0 for s in infos] + [0], np.int64)
    return names, endpoints, bases, np.append(store.segments.unit_bits[:len(infos)], 0)


# key index, replica id, segment code, address, size: ReplicaBuffer's columns, in that order
_BUFFER_DTYPES = (np.int64, REPLICA_COLUMNS["replica_id"], np.int32, np.int64, np.int64)


class ReplicaBuffer:
    """Replica columns for a whole batch read, a full row of replica slots per key: each
    chunk's kernel call writes its replicas right after the previous chunk's, so the batch's
    columns are then views of these arrays (:func:`replica_table`), not copies of the chunks'."""

    def __init__(self, store: MetadataStore, keys: int) -> None:
        cap = keys * store.objects.slots
        self.key_index, self.replica_id, self.segment_code, self.address, self.size = (
            np.empty(cap, dt) for dt in _BUFFER_DTYPES)
        self.filled = 0

    def columns(self) -> tuple[np.ndarray, ...]:
        """The columns written so far (key index, replica id, segment code, address, size): views,
        or copies when they fill less than half the buffer (a view keeps all of it alive)."""
        n = self.filled
        return tuple(a[:n] if 2 * n >= a.size else a[:n].copy()
                     for a in (self.key_index, self.replica_id, self.segment_code, self.address, self.size))


_NO_BUFFER = tuple(np.empty(0, dt) for dt in _BUFFER_DTYPES)


def read_batch(store: MetadataStore, offsets: np.ndarray, data: np.ndarray, tenant: int, now: int, ttl_ns: int,
               *, want_replicas: bool, key_base: int = 0,
               buffer: ReplicaBuffer | None = None) -> tuple[np.ndarray, "ReplicaColumns | None"]:
    """Read codes of a batch of keys of tenant code ``tenant`` (the read leases granted), and
    with ``want_replicas`` the readable replicas' descriptor columns, key indices counted from
    ``key_base`` (one kernel call, kernels/reads.read_batch; written into ``buffer`` after its
    filled slots when there is room, see :class:`ReplicaBuffer`); the caller holds the master lock."""
    o, k = store.objects, store.keys
    n = offsets.size - 1
    codes = np.empty(n, np.int32)
    if want_replicas:
        names, endpoints, bases, unit_bits = _segment_lists(store)
        buffer = buffer or ReplicaBuffer(store, n)
        k0 = buffer.filled
        out: tuple[np.ndarray, ...] = (buffer.key_index, buffer.replica_id, buffer.segment_code, buffer.address,
                                       buffer.size)
    else:
        names, endpoints, bases, unit_bits = [], [], np.zeros(1, np.int64), np.zeros(1, np.int64)
        k0, out = 0, _NO_BUFFER
    count, fits, *own = rk.read_batch(
        k.table, k.arena, o.key_ref, o.tenant, offsets, data, np.array([tenant], np.int32), now, ttl_ns,
        o.flags, o.lease_deadline_ns, store.group_of.links(), o.replica_status, o.replica_kind, o.replica_segment,
        store.segments.readable, o.replica_more, o.replica_id, o.replica_offset, o.size_bytes, bases, unit_bits,
        want_replicas, codes, key_base, k0, *out)
    if not want_replicas:
        return codes, None
    if fits:
        assert buffer is not None
        buffer.filled = k0 + count
        own = [a[k0:k0 + count] for a in out]
    return codes, ReplicaColumns(own[0], own[1], own[2], names, endpoints, own[3], own[4], buffer if fits else None)


@dataclass(frozen=True)
class ReplicaColumns:
    """Replica descriptors gathered under the lock: the columns of a replica table, segments
    as codes into the ``names``/``endpoints`` of that moment."""

    key_index: np.ndarray  # counted from the start of the whole batch
    replica_id: np.ndarray
    segment_code: np.ndarray
    names: list[str]
    endpoints: list[str]
    address: np.ndarray
    size: np.ndarray
    buffer: ReplicaBuffer | None = None  # the batch's columns these are the next slice of


def joined_replica_columns(parts: list[ReplicaColumns]) -> ReplicaColumns:
    """One set of replica columns from chunks' columns, in batch order: views of the batch's
    :class:`ReplicaBuffer` when every chunk's replicas are in it (they lie there back to back),
    else concatenated. Takes the parts' columns over: a chunk's segment codes are shifted in place
    when a mount between chunks changed the names."""
    names: list[str] = []
    endpoints: list[str] = []
    for c in parts:  # per chunk, not per replica: segment codes into one joined name list
        if c.names == names and c.endpoints == endpoints:  # the usual case: no mount in between
            continue
        np.add(c.segment_code, len(names), out=c.segment_code)
        names += c.names
        endpoints += c.endpoints
    filled = [c for c in parts if c.key_index.size]
    buffer = filled[0].buffer if filled else None
    if buffer is not None and all(c.buffer is buffer for c in filled):
        key_index, replica_id, segment_code, address, size = buffer.columns()
    else:
        key_index, replica_id, segment_code, address, size = (
            np.concatenate([getattr(c, name) for c in parts]).astype(dt, copy=False) if parts else np.empty(0, dt)
            for name, dt in (("key_index", np.int64), ("replica_id", np.uint64), ("segment_code", np.int32),
                             ("address", np.int64), ("size", np.int64)))
    return ReplicaColumns(key_index, replica_id, segment_code, names, endpoints, address, size)


def replica_table(parts: list[ReplicaColumns]) -> pa.Table:
    """One replica table from chunks' columns (see :func:`joined_replica_columns`). ``segment``
    and ``endpoint`` are dictionary-encoded over the segments' names: building a string per
    replica was a tenth of a 1M-key batch get."""
    c = joined_replica_columns(parts)
    codes = pa.array(c.segment_code, pa.int32())
    return pa.table({
        "key_index": c.key_index,
        "replica_id": c.replica_id,
        "segment": pa.DictionaryArray.from_arrays(codes, pa.array(c.names, pa.string())),
        "endpoint": pa.DictionaryArray.from_arrays(codes, pa.array(c.endpoints, pa.string())),
        "address": c.address,
        "size": c.size,
    })
