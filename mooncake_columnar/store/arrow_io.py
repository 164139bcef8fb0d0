"""The three Arrow tables of a SnapshotState (objects, replicas, segments) -> engine columns.

Loading turns the tables into the store's columns and inserts them (``MetadataStore.insert_objects``,
as standby apply does: slice writes into an empty engine, the key index built in bulk), vectorized:
loops over segments, dictionaries and groups only (few), never per object in Python. The other
direction is :mod:`.arrow_export`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa

from ..kernels.jit import njit
from ..errors import SegmentExtentsCorrupt, SnapshotExtentError
from ..mapped import release_mapped
from ..memory import prefault
from ..schema import (
    OBJECT_COLUMNS,
    REPLICA_COLUMNS,
    FLAG_HARD_PINNED,
    FLAG_LIVE,
    FLAG_PROCESSING,
    FLAG_SOFT_PIN_ENABLED,
)
from .inserts import NewObjects
from .keys import as_string_array, string_buffers
from .rebuild import rebuild_all
from .segments import Segment
from .snapshot_state import SnapshotState, name_codes

if TYPE_CHECKING:
    from .metadata import MetadataStore


@njit(cache=True, nogil=True)
def _or_flag(flags, bits, offset, bit):
    """flags[i] |= bit where Arrow bitmap ``bits`` (LSB first, from bit ``offset``) has row i set."""
    for i in range(flags.shape[0]):
        j = i + offset
        if (bits[j >> 3] >> (j & 7)) & 1:
            flags[i] |= bit


# ---- loading --------------------------------------------------------------------------------------
def load_tables(m: "MetadataStore", state: SnapshotState, *, segments_readable: bool) -> None:
    """Fill an EMPTY master from a validated state (objects table order = replica object_index),
    LOAD_BATCH_ROWS objects at a time: the pages of a mapped snapshot file are let go after each
    pass (mapped.py), so a restore's peak is about the engine it fills."""
    if m.objects.high_water or m.objects.free_count:
        raise ValueError("load_tables fills an empty master")
    segments = state.segments
    # segments first: replica segment names resolve to their codes
    for name, endpoint, client, base, size, segment_id, host_id in zip(*(segments.column(c).to_pylist() for c in (
            "name", "endpoint", "client", "base", "size", "segment_id", "host_id"))):
        m.segments.mount(Segment(name, endpoint, client, int(base), int(size), segment_id, host_id),
                         readable=segments_readable)
    objects, replicas = state.objects, state.replicas
    key_bytes = sum(_string_bytes(chunk) for chunk in objects.column("key").chunks)
    m.keys.reserve(objects.num_rows, key_bytes)  # once: no index rehash or arena growth between batches
    # the empty columns (zeros, as allocated) and the keys' arena span fault in now, from several
    # threads: the slice writes below would fault them in one page at a time, on this thread
    o, keys = m.objects, m.keys
    prefault([*(getattr(o, name) for name in (*OBJECT_COLUMNS, *REPLICA_COLUMNS)),
              keys.arena[keys.arena_used:keys.arena_used + key_bytes]])
    for lo, hi, r_lo, r_hi in _batches(objects.num_rows, replicas):  # batch by batch: bounded temporaries
        append_objects(m, objects.slice(lo, hi - lo), replicas.slice(r_lo, r_hi - r_lo), release_mapped,
                       first_object=lo)
    # an empty master without free rows: object i went to row i
    m.objects.set_checksums(state.checksums.column("object_index").to_numpy(),
                            state.checksums.column("checksum").to_numpy())
    _rebuild_allocators(m, objects.num_rows)


def _string_bytes(keys: pa.Array) -> int:
    """Bytes of a string or large_string array's values, from its first and last offsets."""
    if not len(keys):
        return 0
    dtype = np.dtype(np.int64 if pa.types.is_large_string(keys.type) else np.int32)
    offsets = np.frombuffer(keys.buffers()[1], dtype, count=len(keys) + 1, offset=keys.offset * dtype.itemsize)
    return int(offsets[-1] - offsets[0])


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


def _rebuild_allocators(m: "MetadataStore", loaded: int) -> None:
    """Each segment's free space becomes the gaps between the loaded memory replicas' held extents
    (object size at the replica offset in whole allocation units, as the engine frees them); an
    overlap, a shared allocation unit or an extent past capacity raises here, typed."""
    try:
        rebuild_all(m.objects, m.segments, loaded)
    except SegmentExtentsCorrupt as e:  # the rebuild's refusal, typed for the loader's caller
        raise SnapshotExtentError("replicas", "offset", None, f"segment {e.segment!r}: {e.detail}") from e
