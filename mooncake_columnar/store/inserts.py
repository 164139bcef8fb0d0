"""Inserting whole objects, given as columns: what a restore and standby apply add to a store.

Both hand over :class:`NewObjects` (names already the store's codes). Rows of an empty store are
filled with slice writes; keys are copied into the arena and indexed in bulk (the index is the
(tenant, key) uniqueness check); groups are linked; replicas go to slots, and continuation rows
for objects wider than a row. Vectorized: loops over groups only, never per object in Python.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

from ..errors import SnapshotIntegrityError
from ..kernels import hashing as hk
from ..kernels import index_load
from ..kernels import objects as ok
from ..schema import EMPTY_CODE, FLAG_PROCESSING, NO_DEADLINE, ST_EMPTY
from .rare_fields import SOFT_PIN_FLAGS

if TYPE_CHECKING:
    from .inflight import InflightTable
    from .keys import KeyIndex
    from .objects import ObjectTable
    from .rare_fields import GroupTable, SoftPinTable
    from .segments import SegmentTable
    from .strings import StringDictionary


class Tables(Protocol):
    """The store (metadata.py: MetadataStore, whose insert_objects calls this module) as the
    inserts see it: the tables they fill."""

    @property
    def objects(self) -> ObjectTable: ...
    @property
    def keys(self) -> KeyIndex: ...
    @property
    def inflight(self) -> InflightTable: ...
    @property
    def soft_pins(self) -> SoftPinTable: ...
    @property
    def group_of(self) -> GroupTable: ...
    @property
    def group_head(self) -> np.ndarray: ...
    @property
    def segments(self) -> SegmentTable: ...
    @property
    def tenants(self) -> StringDictionary: ...

_KEY_COPY_CHUNK = 64 << 20  # key bytes copied into the arena between two after_pass calls


@dataclass(frozen=True)
class NewObjects:
    """Objects to insert, one row each, and their replicas, one row each."""

    tenant: np.ndarray              # int32 tenant codes
    key_offsets: np.ndarray         # int64, objects + 1 (from any base) into key_data
    key_data: np.ndarray            # uint8 UTF-8
    client: np.ndarray              # int32 client codes
    group: np.ndarray               # int64 group codes (MetadataStore.group_codes), -1: ungrouped
    size_bytes: np.ndarray          # int64
    data_type: np.ndarray           # uint8
    flags: np.ndarray               # uint8: FLAG_LIVE and the pin and processing bits
    lease_deadline_ns: np.ndarray   # int64
    soft_pin_deadline_ns: np.ndarray  # int64
    put_start_ms: np.ndarray        # int64 system ms, 0: unknown
    replica_object: np.ndarray      # int64: each replica's object, an index into the rows above
    replica_segment: np.ndarray     # int32 segment code (a LOCAL_DISK replica: its owner client's)
    replica_kind: np.ndarray        # uint8
    replica_status: np.ndarray      # uint8
    replica_offset: np.ndarray      # int64 bytes
    replica_id: np.ndarray          # uint64


def insert_objects(m: Tables, new: NewObjects, after_pass: Callable[[], None] = lambda: None) -> np.ndarray:
    """Add objects whose (tenant, key) are new (else SnapshotIntegrityError, nothing indexed
    twice); memory replicas' segments must be mounted, their extents are not allocated here
    (the caller installs the free lists). Returns the new rows in order. ``after_pass`` runs
    after each pass over some of ``new``'s columns (a restore lets go of the pages of the
    memory-mapped file they lie in: mapped.py)."""
    o = m.objects
    rows, sel = _new_rows(o, new.size_bytes.size)
    for name in ("tenant", "client", "size_bytes", "data_type", "flags", "lease_deadline_ns"):
        getattr(o, name)[sel] = getattr(new, name)
        after_pass()
    soft = np.flatnonzero((new.flags & SOFT_PIN_FLAGS) | (new.soft_pin_deadline_ns != NO_DEADLINE))
    if soft.size:
        m.soft_pins.add(rows[soft], new.soft_pin_deadline_ns[soft])
    o.set_put_start(rows, new.put_start_ms)
    after_pass()
    processing = np.flatnonzero(new.flags & FLAG_PROCESSING)
    if processing.size:
        slots = m.inflight.take(rows[processing])
        m.inflight.started(slots, new.put_start_ms[processing])
    _insert_keys(m, rows, new.key_offsets, new.key_data, after_pass)
    _link_groups(m, rows, new.group)
    _place_replicas(m, rows, new, after_pass, fresh=sel if isinstance(sel, slice) else None)
    return rows


def _new_rows(o: ObjectTable, n: int) -> tuple[np.ndarray, slice | np.ndarray]:
    """(rows, selector) for ``n`` new objects. A table without free rows (an empty one, or one
    a restore fills batch by batch) takes the next n rows past its high water, never used
    since its columns were allocated, and they are written by slice (take_rows' per-row clear
    would scatter through a row index)."""
    if o.free_count == 0:
        lo = o.high_water
        o.reserve(n)
        o.high_water, o.live_count = lo + n, o.live_count + n
        rows = np.arange(lo, lo + n, dtype=np.int64)
        o.replica_refcnt[lo:lo + n] = 0  # the other columns are written by insert_objects
        return rows, slice(lo, lo + n)
    rows = o.take_rows(n)
    return rows, rows


def _insert_keys(m: Tables, rows: np.ndarray, offsets: np.ndarray, data: np.ndarray,
                 after_pass: Callable[[], None]) -> None:
    """Copy the key bytes into the arena and index every row."""
    o = m.objects
    n = rows.size
    nbytes = int(offsets[-1] - offsets[0])
    m.keys.reserve(n, nbytes)
    start = m.keys.arena_used
    first = int(offsets[0])
    for done in range(0, nbytes, _KEY_COPY_CHUNK):  # in chunks: after_pass lets each one's input go
        step = min(_KEY_COPY_CHUNK, nbytes - done)
        m.keys.arena[start + done:start + done + step] = data[first + done:first + done + step]
        after_pass()
    if not index_load.set_key_refs(o.key_ref, rows, offsets, start - int(offsets[0])):
        raise SnapshotIntegrityError(f"objects: a key is longer than {(1 << hk.KEY_LENGTH_BITS) - 1} bytes")
    after_pass()
    dup = index_load.bulk_insert_unique(m.keys.table, rows, m.keys.arena, o.key_ref, o.tenant)
    if dup >= 0:
        key = bytes(data[offsets[dup]:offsets[dup + 1]]).decode("utf-8", "replace")
        raise SnapshotIntegrityError(f"objects: duplicate (tenant, key) ({m.tenants.name(int(o.tenant[rows[dup]]))}, "
                                     f"{key})")
    m.keys.note_inserted(n, start + nbytes)


def _link_groups(m: Tables, rows: np.ndarray, group: np.ndarray) -> None:
    """Link the grouped rows into their groups' member lists (a kernel per group)."""
    grouped = np.flatnonzero(group >= 0)
    if not grouped.size:
        return
    o = m.objects
    codes, inverse = np.unique(group[grouped], return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(codes.size + 1))
    for i, code in enumerate(codes.tolist()):  # one iteration per group
        members = rows[grouped[order[bounds[i]:bounds[i + 1]]]]
        m.group_of.add(members, code)
        ok.link_group_members(members, code, m.group_head, m.group_of.links(), o.flags)


def _place_replicas(m: Tables, rows: np.ndarray, new: NewObjects, after_pass: Callable[[], None], *,
                    fresh: slice | None) -> None:
    """Replica slot = rank of the replica within its object (``fresh``: the never-used rows'
    slice, the rows in order; None: rows taken by take_rows, cleared)."""
    o = m.objects
    oi = new.replica_object
    if oi.size and (oi[1:] > oi[:-1]).all():
        slot = None  # the usual case: one replica per object, in object order
    else:
        order = np.argsort(oi, kind="stable")
        oi_sorted = oi[order]
        first = np.searchsorted(oi_sorted, oi_sorted, side="left")
        slot = np.empty_like(oi)
        slot[order] = np.arange(oi.size) - first
    counts = None if slot is None else np.bincount(oi, minlength=rows.size)
    # the slot columns widen to the commonly used counts only; wider objects get continuation rows
    o.ensure_slots(1 if counts is None else int(counts[counts <= o.hot_slots_max].max(initial=1)))
    if slot is None and fresh is not None and oi.size == rows.size and o.slots == 1:
        target: tuple = (fresh, 0)  # object i's only replica fills row i's only slot
    else:
        if fresh is not None:  # slots no replica fills are empty
            for name, fill in (("replica_status", ST_EMPTY), ("replica_segment", EMPTY_CODE), ("replica_kind", 0),
                               ("replica_offset", 0), ("replica_id", 0)):
                getattr(o, name)[fresh] = fill
        target = (rows[oi], 0 if slot is None else slot)
        if slot is not None and int(slot.max(initial=0)) >= o.slots:
            target = _chained_target(o, rows, oi, slot)
    for name in ("replica_segment", "replica_kind", "replica_status", "replica_id"):
        getattr(o, name)[target] = getattr(new, name)
        after_pass()
    o.replica_offset[target] = m.segments.column_offsets(new.replica_offset, new.replica_kind, new.replica_segment)
    after_pass()


def _chained_target(o: ObjectTable, rows: np.ndarray, oi: np.ndarray,
                    slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, slot) of each replica when some object has more than the row's slots: the others
    go to new continuation rows of its chain, in rank order."""
    target_rows, target_slots = rows[oi], slot.copy()
    extra = np.flatnonzero(slot >= o.slots)
    extra = extra[np.lexsort((slot[extra], oi[extra]))]
    objects, counts = np.unique(oi[extra], return_counts=True)
    at, at_slot = o.extra_slots(rows[objects], counts)
    target_rows[extra], target_slots[extra] = at, at_slot
    return target_rows, target_slots
