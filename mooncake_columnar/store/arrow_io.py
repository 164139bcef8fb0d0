"""Columns <-> the three Arrow tables of a SnapshotState (objects, replicas, segments).

Both directions are vectorized: per-segment and per-dictionary loops only (few), never per
object. Loading fills an EMPTY engine; the caller validated the state first.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..kernels import hashing as hk
from ..kernels import objects as ok
from ..schema import (FLAG_HARD_PINNED, FLAG_LIVE, FLAG_PROCESSING, FLAG_SOFT_PIN_ENABLED,
                      KIND_MEMORY, REPLICAS_ARROW_SCHEMA, SEGMENTS_ARROW_SCHEMA)
from ..errors import SnapshotIntegrityError
from .segments import Segment
from .strings import StringDictionary

if TYPE_CHECKING:
    from ..master import MasterService


def _codes(column: pa.ChunkedArray | pa.Array, dictionary: StringDictionary) -> np.ndarray:
    """Dictionary-encode a string column into ``dictionary``'s int32 codes."""
    enc = pc.dictionary_encode(column)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    values = enc.dictionary.to_pylist()
    lut = np.array([dictionary.code(v) for v in values], np.int32)
    return lut[enc.indices.to_numpy(zero_copy_only=False)] if len(values) else np.zeros(0, np.int32)


def export_tables(m: "MasterService") -> tuple[pa.Table, pa.Table, pa.Table]:
    """(objects, replicas, segments) of the live state; objects ordered by row."""
    o = m.objects
    objects = m._objects_table()
    rows = o.live_rows()
    status = o.replica_status[rows]
    r_idx, slot = np.nonzero(status != 0)
    src = rows[r_idx]
    names = [s.name if s else "" for s in m.segments.info] + [""]
    memory = o.replica_kind[src, slot] == int(KIND_MEMORY)
    seg_idx = np.where(memory & (o.replica_segment[src, slot] >= 0), o.replica_segment[src, slot], len(names) - 1)
    readable = ok.readable_mask(src, slot.astype(np.int64), o.replica_status, o.replica_kind,
                                o.replica_segment, m.segments.readable)
    replicas = pa.table({
        "object_index": r_idx.astype(np.int64),
        "replica_id": o.replica_id[src, slot],
        "kind": o.replica_kind[src, slot],
        "status": status[r_idx, slot],
        "segment": pa.array(names, pa.string()).take(pa.array(seg_idx.astype(np.int32))),
        "offset": o.replica_offset[src, slot],
        "size": o.size_bytes[src],
        "readable": readable,
    }, schema=REPLICAS_ARROW_SCHEMA)
    live = [(c, s) for c, s in enumerate(m.segments.info) if s is not None]
    codes = np.array([c for c, _ in live], np.int64)
    segments = pa.table({
        "name": [s.name for _, s in live],
        "endpoint": [s.endpoint for _, s in live],
        "client": [s.client for _, s in live],
        "base": pa.array([s.base for _, s in live], pa.uint64()),
        "size": pa.array([s.size for _, s in live], pa.int64()),
        "used": m.segments.used[codes] if codes.size else np.zeros(0, np.int64),
        "readable": m.segments.readable[codes] if codes.size else np.zeros(0, np.bool_),
    }, schema=SEGMENTS_ARROW_SCHEMA)
    return objects, replicas, segments


def load_tables(m: "MasterService", objects: pa.Table, replicas: pa.Table, segments: pa.Table, *,
                segments_readable: bool) -> None:
    """Fill an empty master from validated tables (objects table order = replica object_index)."""
    # segments first: replica segment names resolve to their codes
    for name, endpoint, client, base, size in zip(*(segments.column(c).to_pylist() for c in
                                                    ("name", "endpoint", "client", "base", "size"))):
        m.segments.mount(Segment(name, endpoint, client, int(base), int(size)), readable=segments_readable)
    append_objects(m, objects, replicas)
    rebuild_allocators(m, range(len(m.segments.info)))


def append_objects(m: "MasterService", objects: pa.Table, replicas: pa.Table) -> np.ndarray:
    """Add objects whose (tenant, key) are new (else SnapshotIntegrityError, nothing indexed
    twice); replica segments must be mounted. Returns the new rows in table order."""
    o = m.objects
    n = objects.num_rows
    rows = o.take_rows(n)
    o.tenant[rows] = _codes(objects.column("tenant"), m.tenants)
    o.client[rows] = _codes(objects.column("client"), m.clients)
    o.size_bytes[rows] = objects.column("size_bytes").to_numpy()
    o.data_type[rows] = objects.column("data_type").to_numpy()
    o.lease_deadline_ns[rows] = objects.column("lease_deadline_ns").to_numpy()
    o.soft_pin_deadline_ns[rows] = objects.column("soft_pin_deadline_ns").to_numpy()
    flags = np.full(n, int(FLAG_LIVE), np.uint8)
    flags[objects.column("hard_pinned").to_numpy(zero_copy_only=False)] |= FLAG_HARD_PINNED
    flags[objects.column("soft_pin_enabled").to_numpy(zero_copy_only=False)] |= FLAG_SOFT_PIN_ENABLED
    processing = objects.column("processing").to_numpy(zero_copy_only=False)
    flags[processing] |= FLAG_PROCESSING
    o.flags[rows] = flags
    if processing.any():
        slots = m.inflight.take(int(processing.sum()))
        o.inflight[rows[processing]] = slots
        m.inflight.put_start_time_ms[slots] = objects.column("put_start_time_ms").to_numpy()[processing]

    # keys: copy the (tenant, key) bytes into the arena and index every row
    keys = objects.column("key").combine_chunks().cast(pa.large_string())
    _, off_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(off_buf, np.int64, count=n + 1, offset=keys.offset * 8)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    nbytes = int(offsets[-1] - offsets[0])
    m.keys.reserve(n, nbytes)
    start = m.keys.arena_used
    m.keys.arena[start:start + nbytes] = data[offsets[0]:offsets[-1]]
    lengths = np.diff(offsets)
    o.key_ref[rows] = ((start + offsets[:-1] - offsets[0]) << hk.KEY_LENGTH_BITS) | lengths
    dup = hk.insert_rows_unique(m.keys.table, rows, m.keys.arena, o.key_ref, o.tenant)
    if dup >= 0:  # the index is the (tenant, key) uniqueness check of a loaded state
        raise SnapshotIntegrityError(f"objects: duplicate (tenant, key) "
                                     f"({objects.column('tenant')[dup]}, {objects.column('key')[dup]})")
    m.keys.note_inserted(n, start + nbytes)

    # groups: one code per (tenant, group); members linked by a kernel
    grouped = np.flatnonzero(pc.not_equal(objects.column("group"), "").to_numpy(zero_copy_only=False))
    if grouped.size:
        pairs = pc.binary_join_element_wise(objects.column("tenant").take(grouped),
                                            objects.column("group").take(grouped), "\0")
        enc = pc.dictionary_encode(pairs).combine_chunks()
        idx = enc.indices.to_numpy()
        order = np.argsort(idx, kind="stable")
        bounds = np.searchsorted(idx[order], np.arange(len(enc.dictionary) + 1))
        for i, pair in enumerate(enc.dictionary.to_pylist()):  # one iteration per group
            tenant, name = pair.split("\0", 1)
            members = rows[grouped[order[bounds[i]:bounds[i + 1]]]]
            ok.link_group_members(members, m._group_code(tenant, name), m.group_head, o.group_next,
                                  o.group, o.flags)

    # replicas: slot = rank of the replica within its object
    oi = replicas.column("object_index").to_numpy()
    if oi.size and (np.diff(oi) > 0).all():
        slot = np.zeros_like(oi)  # the usual case: one replica per object, in object order
    else:
        order = np.argsort(oi, kind="stable")
        oi_sorted = oi[order]
        first = np.searchsorted(oi_sorted, oi_sorted, side="left")
        slot = np.empty_like(oi)
        slot[order] = np.arange(oi.size) - first
    o.ensure_slots(int(slot.max()) + 1 if slot.size else 1)
    target = rows[oi]
    seg_names = replicas.column("segment")
    seg_code = np.array([m.segments.code(s) for s in pc.unique(seg_names).to_pylist()], np.int32)
    lookup = pc.index_in(seg_names, value_set=pc.unique(seg_names)).to_numpy(zero_copy_only=False)
    o.replica_segment[target, slot] = seg_code[lookup] if seg_code.size else -1
    o.replica_kind[target, slot] = replicas.column("kind").to_numpy()
    o.replica_status[target, slot] = replicas.column("status").to_numpy()
    o.replica_offset[target, slot] = replicas.column("offset").to_numpy()
    o.replica_id[target, slot] = replicas.column("replica_id").to_numpy()
    return rows


def occupied_extents(m: "MasterService", codes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segment code, offset, size) of every memory replica on the given segments, one pass."""
    o = m.objects
    hw = o.high_water
    wanted = np.zeros(max(1, len(m.segments.info)), np.bool_)
    wanted[list(codes)] = True
    seg = o.replica_segment[:hw]
    mem = ((o.replica_kind[:hw] == int(KIND_MEMORY)) & (o.replica_status[:hw] != 0) & (seg >= 0)
           & ((o.flags[:hw] & FLAG_LIVE) != 0)[:, None])
    mem &= wanted[np.where(mem, seg, 0)]
    r, j = np.nonzero(mem)
    return seg[r, j].astype(np.int64), o.replica_offset[r, j], o.size_bytes[r]


def rebuild_allocators(m: "MasterService", codes) -> None:
    """Each listed segment's free space becomes the gaps between its occupied extents."""
    segs, offs, sizes = occupied_extents(m, codes)
    by_seg = np.argsort(segs, kind="stable")
    for code in codes:
        lo, hi = np.searchsorted(segs[by_seg], [code, code + 1])
        sel = by_seg[lo:hi]
        m.segments.rebuild_allocator(code, offs[sel], sizes[sel])
