"""Engine columns <-> the three Arrow tables of a SnapshotState (objects, replicas, segments).

Export is two steps so that a snapshot holds the master's lock only for memcpy-speed work:
:func:`freeze` copies the raw columns of rows [0, high_water) (and the small dictionaries) under
the lock; :func:`frozen_state` builds the tables from the copies afterwards, in the *encoded*
layout (name columns are the engine's codes plus its string dictionary; keys come straight out of
the arena), so no step does per-row string work. Loading turns the tables into the store's
columns and inserts them (``MetadataStore.insert_objects``, as standby apply does: slice writes
into an empty engine, the key index built in bulk). Both directions are vectorized: loops over
segments, dictionaries and groups only (few), never per object in Python.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from ..errors import SegmentExtentsCorrupt, SnapshotExtentError
from ..kernels import arena as arena_k
from ..kernels import chains as chain_k
from ..kernels import hashing as hk
from ..kernels import objects as ok
from ..kernels.predicates import memory_on_segment_mask, memory_replica_segment
from ..schema import (
    CHECKSUMS_ARROW_SCHEMA,
    FLAG_GROUPED,
    FLAG_HARD_PINNED,
    FLAG_LIVE,
    FLAG_PROCESSING,
    FLAG_SOFT_PIN_ENABLED,
    KIND_LOCAL_DISK,
    KIND_MEMORY,
    OBJECTS_PAYLOAD_SCHEMA,
    REPLICAS_PAYLOAD_SCHEMA,
    ST_EMPTY,
)
from .inserts import NewObjects
from .keys import as_string_array, string_buffers
from .objects import put_start_ms
from .rebuild import rebuild_all
from .segments import Segment, segments_table
from .rare_fields import GroupTable, SoftPinTable

if TYPE_CHECKING:
    from .metadata import MetadataStore
    from ..snapshots.state import SnapshotState

# Per-object columns a snapshot needs, and the replica slot columns (engine attribute names).
FROZEN_OBJECT_COLUMNS = ("flags", "tenant", "client", "size_bytes", "data_type",
                         "lease_deadline_ns", "key_ref", "put_start_rel")
FROZEN_REPLICA_COLUMNS = ("replica_status", "replica_kind", "replica_segment", "replica_offset",
                          "replica_id")

# (name, shape, dtype) -> an array to copy into; lets a caller hand out reusable, already
# page-faulted buffers (first touches of fresh memory cost more than the copy itself).
Allocator = Callable[[str, tuple[int, ...], np.dtype], np.ndarray]


def _fresh(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


@dataclass(frozen=True)
class FrozenColumns:
    """A master's state at one instant: copies of its mutable columns, rows [0, high_water)."""

    columns: dict[str, np.ndarray]
    arena: np.ndarray             # the key arena itself, not a copy: see freeze()
    put_start_base_ms: int | None  # put_start_rel is ms after it (ObjectTable.set_put_start)
    checksum_rows: np.ndarray      # the sparse object checksums (copies)
    checksum_values: np.ndarray
    soft_pins: tuple[np.ndarray, np.ndarray]  # (rows, deadlines) of the objects that hold one (copies)
    groups: tuple[np.ndarray, np.ndarray]     # (rows, group codes) of the grouped objects (copies)
    tenants: list[str]
    clients: list[str]
    group_names: list[str]
    segments: list[Segment | None]
    segment_readable: np.ndarray
    replica_next_id: int


def freeze(m: "MetadataStore", alloc: Allocator | None = _fresh) -> FrozenColumns:
    """Copy what a snapshot needs; the caller holds ``m``'s lock. Only memcpy and small lists.
    ``alloc=None``: views of the live columns, no copy (a forked writer's own copy-on-write
    memory, which nothing else changes: snapshots/forked.py).

    The key arena is referenced, not copied: it is append-only (inserts write past
    ``arena_used``; growth and compaction build a new array), so the bytes the copied
    ``key_ref`` values point at never change in the array object held here.
    """
    o = m.objects
    hw = o.high_water
    columns = {}
    for name in (*FROZEN_OBJECT_COLUMNS, *FROZEN_REPLICA_COLUMNS):
        src = getattr(o, name)[:hw]
        if alloc is None:
            columns[name] = src
        else:
            columns[name] = alloc(name, src.shape, src.dtype)
            np.copyto(columns[name], src)
    if o.replica_more.size:  # wide objects' continuation rows (kernels/chains.py): rare, a plain copy
        columns["replica_more"] = o.replica_more[:hw] if alloc is None else o.replica_more[:hw].copy()
    s = m.segments
    return FrozenColumns(
        columns=columns, arena=m.keys.arena, put_start_base_ms=o.put_start_base_ms,
        checksum_rows=o.checksum_rows.copy(), checksum_values=o.checksum_values.copy(),
        soft_pins=m.soft_pins.held(), groups=m.group_of.held(),
        tenants=[m.tenants.name(c) for c in range(len(m.tenants))],
        clients=[m.clients.name(c) for c in range(len(m.clients))],
        group_names=list(m.group_names), segments=list(s.info),
        segment_readable=s.readable[:len(s.info)].copy(),
        replica_next_id=int(m.next_replica_id))


def _names(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    """Engine codes (-1: none, decoded as "") as a name-dictionary array."""
    from ..snapshots.state import name_array
    if codes.size and codes.min() < 0:
        codes, names = np.where(codes < 0, len(names), codes), [*names, ""]
    return name_array(codes, names)


@njit(cache=True, nogil=True)
def _contiguous_offsets(refs, out):
    """Fill out[:n + 1] with the offsets of keys ``refs`` relative to the first key's start and
    return True if they lie back to back in the arena (one slice of it), else False."""
    base = refs[0] >> hk.KEY_LENGTH_BITS
    out[0] = 0
    for i in range(refs.shape[0]):
        if (refs[i] >> hk.KEY_LENGTH_BITS) - base != out[i]:
            return False
        out[i + 1] = out[i] + (refs[i] & ((1 << hk.KEY_LENGTH_BITS) - 1))
    return True


@njit(cache=True, nogil=True)
def _flag_bits(flags, bit):
    """An Arrow boolean buffer (LSB-first bits) of ``flags & bit != 0``: no byte-per-row mask."""
    out = np.zeros((flags.shape[0] + 7) // 8, np.uint8)
    for i in range(flags.shape[0]):
        if flags[i] & bit:
            out[i >> 3] |= np.uint8(1 << (i & 7))
    return out


@njit(cache=True, nogil=True)
def _iota(out):
    for i in range(out.shape[0]):
        out[i] = i
    return out


@njit(cache=True, nogil=True)
def _or_flag(flags, bits, offset, bit):
    """flags[i] |= bit where Arrow bitmap ``bits`` (LSB first, from bit ``offset``) has row i set."""
    for i in range(flags.shape[0]):
        j = i + offset
        if (bits[j >> 3] >> (j & 7)) & 1:
            flags[i] |= bit


def _flag(flags: np.ndarray, bit: np.uint8) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), flags.shape[0], [None, pa.py_buffer(_flag_bits(flags, bit))])


def _keys(arena: np.ndarray, refs: np.ndarray, alloc: Allocator) -> pa.Array:
    """The keys of ``refs`` as a large_string array. Keys laid out back to back in the arena (a
    bulk load or a restore, with no removal since) are one slice of it, else gathered."""
    n = refs.shape[0]
    offsets = alloc("key_offsets", (n + 1,), np.dtype(np.int64))
    if n and _contiguous_offsets(refs, offsets):
        start = int(refs[0] >> hk.KEY_LENGTH_BITS)
        data = arena[start:start + offsets[-1]]
    else:
        offsets, data = arena_k.gather_keys(arena, refs, np.arange(n, dtype=np.int64))
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def frozen_state(f: FrozenColumns, alloc: Allocator = _fresh) -> "SnapshotState":
    """The encoded-layout SnapshotState of a frozen master (no lock needed: only copies are read).

    Columns are zero-copy views of the frozen copies where every row is live (the usual case);
    the larger derived arrays come from ``alloc`` (reused buffers: the tables reference them
    until published).
    """
    from ..snapshots.state import SnapshotState, layout_table
    c = f.columns
    flags = c["flags"]
    is_live = (flags & FLAG_LIVE) != 0
    live = None if is_live.all() else np.flatnonzero(is_live)  # None: every row, no gather

    def rows(a: np.ndarray) -> np.ndarray:
        return a if live is None else a[live]

    fl = rows(flags)
    n = fl.shape[0]
    grouped = (fl & FLAG_GROUPED) != 0
    put_start = put_start_ms(rows(c["put_start_rel"]), f.put_start_base_ms)
    status = rows(c["replica_status"])
    used = status != ST_EMPTY
    chains = None
    if "replica_more" in c:  # an object's slots: its row's, then its continuation rows'
        owner, chain = chain_k.expand(_iota(np.empty(fl.shape[0], np.int64)) if live is None else live,
                                      c["replica_more"])
        chained = c["replica_status"][chain] != ST_EMPTY
        chains = (owner, chain, chained)
    objects = layout_table(OBJECTS_PAYLOAD_SCHEMA, {
        "tenant": _names(rows(c["tenant"]), f.tenants),
        "key": _keys(f.arena, rows(c["key_ref"]), alloc),
        "client": _names(rows(c["client"]), f.clients),
        "size_bytes": rows(c["size_bytes"]),
        "data_type": rows(c["data_type"]),
        "group": _names(np.where(grouped, rows(GroupTable.dense(*f.groups, flags.size)), -1) if grouped.any()
                        else np.zeros(n, np.int8), f.group_names if grouped.any() else [""]),
        "hard_pinned": _flag(fl, FLAG_HARD_PINNED),
        "soft_pin_enabled": _flag(fl, FLAG_SOFT_PIN_ENABLED),
        "lease_deadline_ns": rows(c["lease_deadline_ns"]),
        "soft_pin_deadline_ns": rows(SoftPinTable.dense(*f.soft_pins, flags.size)),
        "put_start_time_ms": put_start,
        "processing": _flag(fl, FLAG_PROCESSING),
        "replica_count": np.sum(used, axis=1, dtype=np.int32, out=alloc("replica_count", (n,), np.dtype(np.int32)))
        if chains is None else np.bincount(chains[0], chains[2].sum(axis=1), minlength=n).astype(np.int32),
    })

    # replicas: one row per used slot, in object order
    src = None
    if chains is not None:
        k, slot = np.nonzero(chains[2])
        r_idx, src = chains[0][k], chains[1][k]

        def reps(name: str) -> np.ndarray:
            return c[name][src, slot]
        src_size = c["size_bytes"][src]  # a continuation row carries its object's size
    elif used.all() and status.shape[1] == 1:  # one replica per object: every column is a view
        r_idx, slot = _iota(alloc("object_index", (n,), np.dtype(np.int64))), np.zeros(n, np.int64)

        def reps(name: str) -> np.ndarray:
            return rows(c[name])[:, 0]
        src_size = objects.column("size_bytes").chunk(0)
    else:
        r_idx, slot = np.nonzero(used)

        def reps(name: str) -> np.ndarray:
            return rows(c[name])[r_idx, slot]
        src_size = rows(c["size_bytes"])[r_idx]
    kind, seg, rep_status = reps("replica_kind"), reps("replica_segment"), reps("replica_status")
    used = _used_bytes(rep_status, kind, seg, np.asarray(src_size), len(f.segments))
    seg_names = [s.name if s else "" for s in f.segments]
    all_memory = bool((kind == KIND_MEMORY).all()) and (not seg.size or seg.min() >= 0)
    if not all_memory:  # a LOCAL_DISK replica's "segment" is its owner client; others ""
        owner = np.where((kind == KIND_LOCAL_DISK) & (seg >= 0), len(seg_names) + seg, -1)
        seg = np.where(memory_on_segment_mask(kind, seg), seg, owner)
        seg_names = seg_names + f.clients
    seg_code = seg
    if src is None:
        src = r_idx if live is None else live[r_idx]
    readable = ok.readable_mask(src, slot.astype(np.int64, copy=False), c["replica_status"], c["replica_kind"],
                                c["replica_segment"], f.segment_readable)
    replicas = layout_table(REPLICAS_PAYLOAD_SCHEMA, {
        "object_index": r_idx.astype(np.int64, copy=False),
        "replica_id": reps("replica_id"),
        "kind": kind,
        "status": rep_status,
        "segment": _names(seg_code, seg_names),
        "offset": reps("replica_offset"),
        "size": src_size,
        "readable": readable,
    })
    codes = np.array([code for code, s in enumerate(f.segments) if s is not None], np.int64)
    segments = segments_table([f.segments[c] for c in codes], used[codes], f.segment_readable[codes])
    checksums = pa.table({  # checksum rows are live object rows
        "object_index": f.checksum_rows if live is None else np.searchsorted(live, f.checksum_rows),
        "checksum": f.checksum_values}, schema=CHECKSUMS_ARROW_SCHEMA)
    return SnapshotState(objects, replicas, segments, f.replica_next_id, checksums)


@njit(cache=True, nogil=True)
def _used_bytes(status, kind, seg, size, n_codes):
    """Bytes of the memory replicas on each segment code: the exact figure upstream reports
    (its allocator's cur_size sums the buffers' sizes; a replica whose removal awaits durability
    still holds its buffer). The engine's own ``SegmentTable.used`` counts whole allocation
    units instead (above 3.75 GiB a unit is more than a byte). One pass, no masks."""
    out = np.zeros(n_codes, np.int64)
    for i in range(kind.shape[0]):
        s = memory_replica_segment(status[i], kind[i], seg[i])
        if s >= 0:
            out[s] += size[i]
    return out


def export_tables(m: "MetadataStore") -> "SnapshotState":
    """The live state (encoded layout); the caller holds ``m``'s lock."""
    return frozen_state(freeze(m))


# ---- loading --------------------------------------------------------------------------------------
def load_tables(m: "MetadataStore", state: "SnapshotState", *, segments_readable: bool) -> None:
    """Fill an EMPTY master from a validated state (objects table order = replica object_index),
    LOAD_BATCH_ROWS objects at a time: the pages of a mapped snapshot file are let go after each
    pass (snapshots/mapped.py), so a restore's peak is about the engine it fills."""
    from ..snapshots.mapped import release_mapped
    if m.objects.high_water or m.objects.free_count:
        raise ValueError("load_tables fills an empty master")
    segments = state.segments
    # segments first: replica segment names resolve to their codes
    for name, endpoint, client, base, size, segment_id, host_id in zip(*(segments.column(c).to_pylist() for c in (
            "name", "endpoint", "client", "base", "size", "segment_id", "host_id"))):
        m.segments.mount(Segment(name, endpoint, client, int(base), int(size), segment_id, host_id),
                         readable=segments_readable)
    objects, replicas = state.objects, state.replicas
    key_bytes = int(pc.sum(pc.binary_length(objects.column("key"))).as_py() or 0)
    m.keys.reserve(objects.num_rows, key_bytes)  # once: no index rehash or arena growth between batches
    for lo, hi, r_lo, r_hi in _batches(objects.num_rows, replicas):  # batch by batch: bounded temporaries
        append_objects(m, objects.slice(lo, hi - lo), replicas.slice(r_lo, r_hi - r_lo), release_mapped,
                       first_object=lo)
    rows = np.arange(objects.num_rows, dtype=np.int64)  # an empty master without free rows: appended in order
    m.objects.set_checksums(rows[state.checksums.column("object_index").to_numpy()],
                            state.checksums.column("checksum").to_numpy())
    _rebuild_allocators(m, rows)


LOAD_BATCH_ROWS = 1 << 21  # objects a restore loads at once: its temporaries stay bounded


def _batches(n: int, replicas: pa.Table) -> list[tuple[int, int, int, int]]:
    """(objects lo, hi, replicas lo, hi) of the load batches: LOAD_BATCH_ROWS objects with their
    replicas each when the replicas come in object order (as written), else one batch."""
    oi = replicas.column("object_index").to_numpy()
    if n <= LOAD_BATCH_ROWS or not bool((oi[1:] >= oi[:-1]).all()):
        return [(0, n, 0, oi.size)] if n else []
    starts = np.arange(0, n, LOAD_BATCH_ROWS)
    r_starts = np.searchsorted(oi, starts).tolist()
    ends = [*starts[1:].tolist(), n]
    return list(zip(starts.tolist(), ends, r_starts, [*r_starts[1:], oi.size]))


def append_objects(m: "MetadataStore", objects: pa.Table, replicas: pa.Table,
                   after_pass: Callable[[], None] = lambda: None, first_object: int = 0) -> np.ndarray:
    """Add the objects of a state's tables (:meth:`MetadataStore.insert_objects`: their (tenant,
    key) must be new, replica segments mounted). Returns the new rows in table order.
    ``after_pass``: see :func:`.inserts.insert_objects`. ``first_object``: the replicas'
    object_index of ``objects``' first row (a batch of a larger table)."""
    from ..snapshots.state import name_codes
    n = objects.num_rows
    # name columns as the store's codes: a lookup over each column's dictionary, no per-row string work
    tenant = m.tenants.codes(*name_codes(objects.column("tenant")))
    client = m.clients.codes(*name_codes(objects.column("client")))
    flags = np.full(n, FLAG_LIVE, np.uint8)
    for name, bit in (("hard_pinned", FLAG_HARD_PINNED), ("soft_pin_enabled", FLAG_SOFT_PIN_ENABLED),
                      ("processing", FLAG_PROCESSING)):
        column = objects.column(name)
        bools = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        if n:  # straight from the Arrow bitmap: no byte-per-row mask
            _or_flag(flags, np.frombuffer(bools.buffers()[1], np.uint8), bools.offset, bit)
    keys = objects.column("key")
    offsets, data = string_buffers(as_string_array(keys.chunk(0) if keys.num_chunks == 1 else keys))
    kind = replicas.column("kind").to_numpy()

    def values(table: pa.Table, name: str) -> np.ndarray:
        return table.column(name).to_numpy()

    return m.insert_objects(NewObjects(
        tenant=tenant, key_offsets=offsets, key_data=data, client=client,
        group=m.group_codes(tenant, *name_codes(objects.column("group"))),
        size_bytes=values(objects, "size_bytes"), data_type=values(objects, "data_type"), flags=flags,
        lease_deadline_ns=values(objects, "lease_deadline_ns"),
        soft_pin_deadline_ns=values(objects, "soft_pin_deadline_ns"),
        put_start_ms=values(objects, "put_start_time_ms"),
        replica_object=values(replicas, "object_index") - first_object,
        replica_segment=m.replica_locations(kind, *name_codes(replicas.column("segment"))),
        replica_kind=kind, replica_status=values(replicas, "status"), replica_offset=values(replicas, "offset"),
        replica_id=values(replicas, "replica_id")), after_pass)


def _rebuild_allocators(m: "MetadataStore", rows: np.ndarray) -> None:
    """Each segment's free space becomes the gaps between the loaded memory replicas' held extents
    (object size at the replica offset in whole allocation units, as the engine frees them); an
    overlap, a shared allocation unit or an extent past capacity raises here, typed."""
    try:
        rebuild_all(m.objects, m.segments, rows)
    except SegmentExtentsCorrupt as e:  # the rebuild's refusal, typed for the loader's caller
        raise SnapshotExtentError("replicas", "offset", None, f"segment {e.segment!r}: {e.detail}") from e
