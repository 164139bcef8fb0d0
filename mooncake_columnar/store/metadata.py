"""MetadataStore: every column and table a master holds, and the primitives that change them.

The one place that allocates, frees and erases: the service, its policies, the journal, standby
apply, Arrow I/O and the integrity checks use this public API (the caller holds the master lock).
No policy here: what to erase, evict or refuse is decided by the callers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import EngineInvariantError
from ..kernels import objects as ok
from ..kernels.erase_guard import first_not_erasable
from ..kernels.slot_lists import emptied_objects
from ..schema import (EMPTY_CODE, FLAG_GROUPED, KIND_LOCAL_DISK, KIND_MEMORY, MAX_CODES, ST_EMPTY, ST_PROCESSING,
                      ReplicaKind, ReplicaStatus)
from ..validation import require_str
from .discarded import DiscardedExtents
from .inserts import NewObjects, insert_objects
from .inflight import InflightTable
from .rare_fields import GroupTable, SoftPinTable
from .keys import KeyIndex
from .ledger import TenantLedger
from .objects import ObjectTable
from .offloads import OffloadQueue
from .scratch import Scratch
from .segments import SegmentTable
from .strings import StringDictionary

if TYPE_CHECKING:
    from .eviction_plan import EvictionPlan

_REMOVED = int(ReplicaStatus.REMOVED)


class MetadataStore:
    """Objects (columns, key index, in-flight puts), segments, dictionaries, groups, the tenant
    ledger, queued offloads and discarded extents of one master."""

    def __init__(self, initial_capacity: int = 1024, *, ledger_on: bool = False,
                 offload_limit: int = 0) -> None:
        self.objects = ObjectTable(initial_capacity)
        self.keys = KeyIndex(self.objects, initial_capacity)
        self.inflight = InflightTable()
        self.soft_pins = SoftPinTable()
        self.group_of = GroupTable()                # row -> group code, grouped objects only
        self.segments = SegmentTable()
        self.tenants = StringDictionary("tenants", MAX_CODES)
        self.clients = StringDictionary("clients", MAX_CODES)
        self.groups = StringDictionary()           # "tenant\0group" -> code (groups are tenant-scoped)
        self.group_names: list[str] = []           # code -> group name (without its tenant)
        self.group_head = np.full(16, -1, np.int64)
        self.next_replica_id = 1
        self.ledger = TenantLedger()               # kept only when ledger_on (multi-tenant quotas)
        self.ledger_on = ledger_on
        self.offloads = OffloadQueue(offload_limit)
        self.discarded = DiscardedExtents()
        self.scratch = Scratch()                   # per-call buffers kept between calls (eviction)

    # ---- lookups ------------------------------------------------------------------------------
    def lookup(self, offsets: np.ndarray, data: np.ndarray, tenant_id: str) -> np.ndarray:
        """Rows of the keys (``offsets``/``data`` buffers) of one tenant; -1 where absent."""
        tenant = self.tenants.find(require_str("tenant_id", tenant_id))
        n = offsets.size - 1
        if tenant < 0:
            return np.full(n, -1, np.int64)
        return self.keys.lookup_batch(offsets, data, np.full(n, tenant, self.objects.tenant.dtype))

    def tenant_rows(self, tenant_id: str | None) -> np.ndarray:
        """Live rows, of one tenant when ``tenant_id`` is given."""
        rows = self.objects.live_rows()
        if tenant_id is None:
            return rows
        return rows[self.objects.tenant[rows] == self.tenants.find(require_str("tenant_id", tenant_id))]

    def group_code(self, tenant: str, group: str) -> int:
        """The code of ``group`` of ``tenant``, made (and the heads grown) on first use."""
        code = self.groups.code(f"{tenant}\0{group}")
        if code == len(self.group_names):
            self.group_names.append(group)
        if code >= self.group_head.size:
            grown = np.full(2 * self.group_head.size, -1, np.int64)
            grown[: self.group_head.size] = self.group_head
            self.group_head = grown
        return code

    def group_codes(self, tenant: np.ndarray, group: np.ndarray, names: list[str]) -> np.ndarray:
        """The group code (:meth:`group_code`, -1 for "": ungrouped) of each object of tenant code
        ``tenant`` in group ``names[group]``; one call per distinct (tenant, group)."""
        out = np.full(group.size, -1, np.int64)
        named = np.array([name != "" for name in names] + [False])
        grouped = np.flatnonzero(named[group]) if group.size else group[:0]
        if grouped.size:
            pairs, inverse = np.unique(tenant[grouped].astype(np.int64) * len(names) + group[grouped],
                                       return_inverse=True)
            codes = [self.group_code(self.tenants.name(pair // len(names)), names[pair % len(names)])
                     for pair in pairs.tolist()]  # one per group
            out[grouped] = np.array(codes, np.int64)[inverse]
        return out

    def replica_locations(self, kind: np.ndarray, codes: np.ndarray, names: list[str]) -> np.ndarray:
        """The replica_segment column of replicas of ``kind`` named ``names[codes]``: the segment's
        code (-1: not mounted), a LOCAL_DISK replica's owner client's code (interned; "": none)."""
        segments = np.array([self.segments.code(s) for s in names] + [EMPTY_CODE], np.int32)
        disk = kind == KIND_LOCAL_DISK
        if not disk.any():
            return segments[codes]
        owners = np.array([self.clients.code(s) if s else EMPTY_CODE for s in names] + [EMPTY_CODE], np.int32)
        return np.where(disk, owners[codes], segments[codes])

    def group_name(self, row: int) -> str:
        """The group name of the object at ``row`` ("" when ungrouped)."""
        o = self.objects
        return self.group_names[int(self.group_of.get(np.array([row]))[0])] if o.flags[row] & FLAG_GROUPED else ""

    # ---- tenant ledger --------------------------------------------------------------------------
    def charge(self, rows: np.ndarray, sign: int) -> None:
        """Add (+1) or take off (-1) the memory ``rows`` hold now to their tenants' ledger."""
        if self.ledger_on:
            self.ledger.charge(self.objects, rows, sign)

    # ---- allocation ---------------------------------------------------------------------------
    def insert_objects(self, new: NewObjects, after_pass: Callable[[], None] = lambda: None) -> np.ndarray:
        """Add whole objects (a restore's, standby apply's): see :func:`.inserts.insert_objects`.
        Returns their rows."""
        return insert_objects(self, new, after_pass)

    def insert_puts(self, picks: np.ndarray, offsets: np.ndarray, data: np.ndarray, tenant: int,
                    sizes: np.ndarray, width: int, preferred: np.ndarray, codes: np.ndarray,
                    rows_out: np.ndarray) -> np.ndarray:
        """Insert the keys ``picks`` (positions into ``offsets``) with ``width`` PROCESSING
        replicas each: rows taken, keys indexed, extents allocated, ids given. Per key, the row
        (``rows_out``) or the refusal (``codes``); returns the new rows, in key order."""
        o, seg = self.objects, self.segments
        free_rows = o.take_rows(picks.size)
        self.keys.reserve(picks.size, int((offsets[picks + 1] - offsets[picks]).sum()))
        extra = np.empty((4, picks.size * max(0, width - o.slots)), np.int64)  # a wide put's other replicas
        used, arena_used, self.next_replica_id, n_extra = ok.insert_new_puts(
            # the tenant as the column's dtype: the key-index kernels it shares with lookups
            # (hash_key, find_or_empty_slot) then compile once, not per tenant type
            picks, offsets, data, o.tenant.dtype.type(tenant), sizes, width, preferred, free_rows,
            self.keys.table, self.keys.arena, self.keys.arena_used, o.key_ref, o.tenant,
            seg.allocatable, seg.capacity, seg.unit_bits, seg.used,
            *seg.extents.arrays(),
            o.replica_segment, o.replica_offset, o.replica_status, o.replica_kind, o.replica_id,
            self.next_replica_id, codes, rows_out, *extra)
        o.release_rows(free_rows[used:])
        self.keys.note_inserted(int(used), int(arena_used))
        new = free_rows[:used]
        o.size_bytes[new] = sizes[picks[codes[picks] == 0]]
        if n_extra:
            self.place_extra_replicas(extra[:, :n_extra])
        return new

    def place_extra_replicas(self, extra: np.ndarray) -> None:
        """Write the replicas a wide put placed beyond its row's slots into continuation rows;
        ``extra`` rows: object row, segment, offset, replica id (grouped by object, in order)."""
        o = self.objects
        owners, counts = np.unique(extra[0], return_counts=True)
        order = np.argsort(extra[0], kind="stable")
        rows, slots = o.extra_slots(owners, counts)
        o.replica_segment[rows, slots] = extra[1, order]
        o.replica_offset[rows, slots] = extra[2, order] >> self.segments.unit_bits[extra[1, order]]  # memory: units
        o.replica_id[rows, slots] = extra[3, order].astype(np.uint64)
        o.replica_status[rows, slots] = int(ST_PROCESSING)
        o.replica_kind[rows, slots] = int(ReplicaKind.MEMORY)

    def complete_puts(self, rows: np.ndarray, client_code: int, now_ns: int, codes: np.ndarray) -> None:
        """PROCESSING -> COMPLETE for ``rows`` of ``client_code`` (codes pre-filled, written in place)."""
        o = self.objects
        released = np.full(rows.size, -1, np.int64)
        found = rows[rows >= 0]
        self.charge(found, -1)
        ok.complete_puts(rows, client_code, now_ns, codes, o.flags, o.client,
                         o.lease_deadline_ns, self.soft_pins.parts(), o.replica_status,
                         self.inflight.index, self.inflight.row, self.inflight.pending_soft_pin_ttl_ns, released,
                         o.replica_more)
        self.inflight.release(released)
        self.charge(found, +1)

    # ---- freeing --------------------------------------------------------------------------------
    def clear_slots(self, rows: np.ndarray, mask: np.ndarray) -> int:
        """Clear the replica slots set in ``mask`` (slot j of rows[i] where mask[i, j]) and free
        their memory extents in one merged pass; returns bytes."""
        o, seg = self.objects, self.segments
        # NumPy's arrays, not the kernel's own: large ones get huge pages where the system has them,
        # so the 80 MB of a 5% eviction at 100M objects took about a thousand page faults, not 19.5
        # thousand. Not kept between calls: a batch remove of every object would keep 16 bytes per
        # slot for good.
        n = int(np.count_nonzero(mask))
        extents = np.empty(n, np.int64), np.empty(n, np.int64)
        per_segment, offs, lens, ascending, dropped = ok.clear_slots(rows, mask, seg.allocatable, o.size_bytes,
                                                                    o.replica_status, o.replica_kind,
                                                                    o.replica_segment, o.replica_offset, seg.unit_bits,
                                                                    *extents)
        seg.extents.free_grouped(per_segment, offs, lens, bool(ascending), seg.used, seg.unit_bits, seg.capacity)
        return int(dropped)

    def drop_slots(self, rows: np.ndarray, mask: np.ndarray) -> int:
        """:meth:`clear_slots` keeping the tenant ledger; returns bytes."""
        if rows.size == 0:
            return 0
        # the objects whose slots change: only the tenant ledger needs them
        touched = np.unique(self.objects.owners(rows[mask.any(axis=1)])) if self.ledger_on else rows[:0]
        self.charge(touched, -1)
        dropped = self.clear_slots(rows, mask)
        self.charge(touched, +1)
        return dropped

    def erase_rows(self, rows: np.ndarray, *, charged: bool = True, slots_cleared: bool = False) -> None:
        """The one erase primitive: every path that drops objects comes here. Refuses (typed,
        nothing changed) a row that is not live or is named twice; then frees the memory
        extents, unlinks groups and keys, cancels offloads, frees in-flight slots and recycles
        the rows. ``charged=False``: the caller already took them off the tenant ledger;
        ``slots_cleared``: the rows hold no replica any more (nothing to free)."""
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return
        o = self.objects
        bad = int(first_not_erasable(rows, o.flags))
        if bad >= 0:  # refuse before anything changes: a stale or repeated row handle
            raise EngineInvariantError("erase_not_live", f"row {int(rows[bad])} is not a distinct live object")
        if charged:
            self.charge(rows, -1)
        if len(self.offloads):
            self.offloads.keep(~np.isin(self.offloads.rows, rows))
        if not slots_cleared:
            chain = o.chains(rows).rows
            self.clear_slots(chain, o.replica_status[chain] != int(ReplicaStatus.UNDEFINED))
        if not self.group_of.empty:  # (no row in a group: no member list to walk)
            ok.unlink_group_members(rows, self.group_head, self.group_of.parts(), self.group_of.links(), o.flags)
        for table in (self.group_of, self.inflight, self.soft_pins):
            table.release_rows(rows)
        self.keys.remove(rows)
        o.release_rows(rows)

    def erase_emptied(self, rows: np.ndarray) -> np.ndarray:
        """Erase the objects of ``rows`` left without any replica; returns them."""
        o = self.objects
        chains = o.chains(rows)
        gone = rows[~chains.any(o.replica_status[chains.rows] != ST_EMPTY)]
        self.erase_rows(gone)
        return gone

    def drop_planned(self, plan: "EvictionPlan") -> int:
        """Drop the replicas an eviction plan removes and erase the objects left without any;
        returns bytes freed."""
        chains = plan.chains
        freed = self.drop_slots(chains.rows, plan.removed)
        emptied = emptied_objects(plan.rows, chains.owner, chains.rows, self.objects.replica_status, int(ST_EMPTY))
        self.erase_rows(emptied, slots_cleared=True)
        return freed

    def finalize_removed(self, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Free the REMOVED slots whose replica ids still match (``rows``: objects' rows or their
        continuation rows, which may have been recycled since); erase objects left without
        replicas. Returns the rows erased."""
        o = self.objects
        status = o.replica_status[rows]
        match = (ids != 0) & (o.replica_id[rows] == ids) & (status == _REMOVED)
        self.drop_slots(rows, match)
        return self.erase_emptied(np.unique(o.owners(rows[match.any(axis=1)])))

    def unmount_segment(self, code: int) -> None:
        """Unmount segment ``code``: its replicas are dropped (the allocator goes with it, nothing
        on it is freed), objects left without replicas erased, its discarded extents forgotten."""
        o = self.objects
        self.segments.allocatable[code] = False
        on_seg = (np.unique(o.owners(np.flatnonzero(o.memory_slots_on(code).any(axis=1))))
                  if self.ledger_on else None)
        if on_seg is not None:
            self.charge(on_seg, -1)
        emptied = ok.drop_slots_on_segment(code, o.high_water, o.flags, o.replica_segment,
                                           o.replica_status, o.replica_kind, o.replica_more)
        if on_seg is not None:
            self.charge(np.setdiff1d(on_seg, emptied), +1)
        self.erase_rows(emptied, charged=False)
        self.discarded.keep(self.discarded.seg != code)
        self.segments.unmount(code)

    # ---- discarded puts -------------------------------------------------------------------------
    def discard_puts(self, rows: np.ndarray, release_after_ms: int) -> None:
        """Abandoned puts: their PROCESSING memory replicas keep their space until put start +
        ``release_after_ms``; the objects are erased now."""
        if rows.size == 0:
            return
        o = self.objects
        self.charge(rows, -1)
        chains = o.chains(rows)
        st = o.replica_status[chains.rows]
        r_idx, slot = np.nonzero((st == int(ST_PROCESSING)) & (o.replica_kind[chains.rows] == int(KIND_MEMORY)))
        held = chains.rows[r_idx]  # the object's row or a continuation row (which carries the size)
        seg = o.replica_segment[held, slot]
        self.discarded.add(seg, self.segments.byte_offsets(o.replica_offset[held, slot], KIND_MEMORY, seg),
                           o.size_bytes[held],
                           o.put_start_ms(rows[chains.owner[r_idx]]) + release_after_ms)
        o.replica_status[held, slot] = int(ReplicaStatus.UNDEFINED)  # not freed by the erase below
        self.erase_rows(rows, charged=False)

    def release_discarded(self, now_ms: int) -> int:
        """Free discarded extents whose release time came; returns how many were released."""
        d = self.discarded
        due = d.release_ms <= now_ms
        if not due.any():
            return 0
        seg = self.segments
        seg.extents.free_many(d.seg[due], d.off[due], d.size[due], seg.used, seg.unit_bits, seg.capacity)
        d.keep(~due)
        return int(due.sum())
