"""Primary side of the oplog: what MasterService appends, and when it may free space.

Upstream's protocol: readability-increasing operations (PUT_END, SEGMENT_MOUNT) are visible before
they are durable; readability-decreasing ones (REMOVE, eviction) hide first (replicas marked
REMOVED, so reads and eviction skip them) and free their space only after the entries are
durable. Every change reserves its entries before it mutates anything (waiting a bounded time
for window space), so nothing becomes visible without its entry: a put_end that finds the window
full stays PROCESSING and answers UNAVAILABLE_IN_CURRENT_STATUS (retry or revoke), a removal
fails with that code, eviction stops its cycle and stays armed. Batches larger than the window
go in window-sized reservations. No deadline ever goes into an entry.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pyarrow as pa

from ..kernels.jit import njit
from ..errors import WindowFull
from ..kernels.allocation import offset_shift
from ..kernels.chains import next_row
from ..kernels.slot_index import slot_value
from ..kernels.predicates import is_grouped, is_hard_pinned, is_soft_pin_enabled
from ..schema import KIND_LOCAL_DISK, KIND_MEMORY, ST_EMPTY, ReplicaStatus
from ..store.segments import Segment
from .oplog import OpLogColumns, OpLogOp, OpType, SegmentPayload
from .writer import OpLogWriter, Reservation

if TYPE_CHECKING:
    from ..changelog import RemovalFinalizer
    from ..store.eviction_plan import EvictionPlan
    from ..store.metadata import MetadataStore

_REMOVED = int(ReplicaStatus.REMOVED)
_COMPLETE = int(ReplicaStatus.COMPLETE)
_MEMORY = int(KIND_MEMORY)
_LOCAL_DISK = int(KIND_LOCAL_DISK)
_PUT_END = np.uint8(OpType.PUT_END)
_REMOVE_OP = np.uint8(OpType.REMOVE)


def _dictionary(codes: np.ndarray, name_of: Callable[[int], str]) -> tuple[np.ndarray, list[str]]:
    """Engine dictionary codes (-1: "") -> (batch-local codes, their strings). Python work is
    per distinct value, never per row."""
    if codes.size == 0:  # e.g. the client column of a batch of REMOVEs
        return np.zeros(0, np.int32), []
    distinct: np.ndarray
    local: np.ndarray
    if codes.size == 1 or (codes == codes[0]).all():  # the usual case: one value
        distinct, local = codes[:1], np.zeros(codes.size, np.int32)
    else:
        distinct, local = np.unique(codes, return_inverse=True)
    return local.astype(np.int32), [name_of(c) if c >= 0 else "" for c in distinct.tolist()]


# A LOCAL_DISK replica's place is its owner client: entry-local codes from here on name clients
_OWNER_BASE = 1 << 30


@njit(inline="always", cache=True)
def _replica_place(kind, segment):
    """Segment code of a memory replica, _OWNER_BASE + owner client of a LOCAL_DISK one, else -1."""
    if segment < 0:
        return -1
    if kind == _MEMORY:
        return segment
    if kind == _LOCAL_DISK:
        return _OWNER_BASE + segment
    return -1


@njit(cache=True)
def _gather_entries(rows, keep, keep_complete, flags, group, client, size_bytes, data_type,
                    replica_status, replica_id, replica_kind, replica_segment, replica_offset, unit_bits, more):
    """Per row: PUT_END if any kept slot (``keep[k, j]`` over the rows of the objects' replica
    chains, ObjectTable.chains order, or with ``keep_complete`` the COMPLETE slots), else REMOVE. Per
    PUT_END row: object row, client code, group code (-1: none), size,
    data type, pin flags and kept replica count; per kept replica (row order, then slot order):
    id, kind, segment code (-1 when not in memory), byte offset and size. One pass, so a single-key
    call is one kernel call rather than dozens of tiny NumPy operations."""
    n = rows.shape[0]
    slots = replica_status.shape[1]
    op = np.empty(n, np.uint8)
    puts = 0
    kept = 0
    q = 0  # row of ``keep``: the chain rows of rows[:i] come before
    for i in range(n):
        c = 0
        rr = np.int64(rows[i])
        while rr >= 0:
            for j in range(slots):
                if keep_complete:
                    c += replica_status[rr, j] == _COMPLETE
                else:
                    c += keep[q, j]
            q += 1
            rr = next_row(more, rr)
        op[i] = _PUT_END if c > 0 else _REMOVE_OP
        if c > 0:
            puts += 1
        kept += c
    put = np.empty(puts, np.int64)
    put_client = np.empty(puts, np.int32)
    put_group = np.empty(puts, np.int32)
    size = np.empty(puts, np.uint64)
    dtype = np.empty(puts, data_type.dtype)
    hard = np.empty(puts, np.bool_)
    soft = np.empty(puts, np.bool_)
    count = np.empty(puts, np.uint32)
    rid = np.empty(kept, np.uint64)
    kind = np.empty(kept, np.uint8)
    seg = np.empty(kept, np.int32)
    offset = np.empty(kept, np.uint64)
    rsize = np.empty(kept, np.uint64)
    p = 0
    r = 0
    q = 0
    for i in range(n):
        row = rows[i]
        if op[i] != _PUT_END:
            rr = np.int64(row)
            while rr >= 0:
                q += 1
                rr = next_row(more, rr)
            continue
        f = flags[row]
        put[p] = row
        put_client[p] = client[row]
        put_group[p] = slot_value(group, row, -1) if is_grouped(f) else -1
        size[p] = size_bytes[row]
        dtype[p] = data_type[row]
        hard[p] = is_hard_pinned(f)
        soft[p] = is_soft_pin_enabled(f)
        c = 0
        rr = np.int64(row)
        while rr >= 0:
            for j in range(slots):
                take = replica_status[rr, j] == _COMPLETE if keep_complete else keep[q, j]
                if take:
                    rid[r] = replica_id[rr, j]
                    kind[r] = replica_kind[rr, j]
                    seg[r] = _replica_place(replica_kind[rr, j], replica_segment[rr, j])
                    shift = offset_shift(replica_kind[rr, j], replica_segment[rr, j], unit_bits)
                    offset[r] = np.int64(replica_offset[rr, j]) << shift
                    rsize[r] = size_bytes[row]
                    r += 1
                    c += 1
            q += 1
            rr = next_row(more, rr)
        count[p] = c
        p += 1
    return op, put, put_client, put_group, size, dtype, hard, soft, count, rid, kind, seg, offset, rsize


_NO_KEEP = np.zeros((0, 0), np.bool_)


class Journal:
    """The change log of one master (changelog.ChangeLog) over an oplog writer: entries built
    from its store's columns; ``finalize(rows, ids)`` frees hidden removals once durable."""

    def __init__(self, writer: OpLogWriter, store: "MetadataStore", finalize: "RemovalFinalizer",
                 admission_timeout_s: float = 0.05) -> None:
        self.writer = writer
        self.store = store
        self.finalize = finalize
        self.admission_timeout_s = admission_timeout_s

    # ---- columns ---------------------------------------------------------------------------
    def _object_columns(self, rows: np.ndarray, keep: np.ndarray | None) -> OpLogColumns:
        """One entry per row, built from the engine columns: PUT_END carrying the replicas that
        stay (``keep`` mask over the slots of the rows' chains, default: the COMPLETE ones), or
        REMOVE when none stays."""
        m = self.store
        o = m.objects
        (op, put, client, group, size, data_type, hard, soft, count, rid, kind, seg, offset,
         rsize) = _gather_entries(rows, _NO_KEEP if keep is None else keep, keep is None, o.flags, m.group_of.parts(),
                                  o.client, o.size_bytes, o.data_type, o.replica_status, o.replica_id,
                                  o.replica_kind, o.replica_segment, o.replica_offset, m.segments.unit_bits,
                                  o.replica_more)
        # one string table: the tenants, clients, groups and segment names these rows use, and ""
        strings: list[str] = []
        coded: dict[str, np.ndarray] = {}
        for name, codes, name_of in (
                ("tenant", o.tenant[rows], m.tenants.name), ("client", client, m.clients.name),
                ("group", group, m.group_names.__getitem__),
                ("replica_segment", seg, lambda c: m.segments.mounted(c).name if c < _OWNER_BASE
                 else m.clients.name(c - _OWNER_BASE))):
            local, names = _dictionary(codes, name_of)
            coded[name] = local + np.int32(len(strings))
            strings += names
        key_offsets, key_bytes = m.keys.key_buffers_of(rows)
        return OpLogColumns(
            op=op, **coded, key_offsets=key_offsets, key_bytes=key_bytes, size=size, data_type=data_type,
            hard_pinned=hard, soft_pin_enabled=soft, replica_count=count,
            put_start_time_ms=o.put_start_ms(put).astype(np.uint64), replica_id=rid, replica_kind=kind,
            replica_offset=offset, replica_size=rsize, replica_status=np.full(rid.size, _COMPLETE, np.uint8),
            replica_endpoint=np.full(rid.size, len(strings), np.int32),  # the journal logs no endpoint
            strings=pa.array(strings + [""], pa.large_string()), segments=())

    def reserve(self, n: int) -> Reservation | None:
        """``n`` sequence ids, waiting up to the admission timeout for window space; None
        (nothing reserved) when none freed. Callers build their entries first and mutate only
        after this succeeded, so a refusal leaves the engine as it was."""
        try:
            return self.writer.reserve(n, timeout_s=self.admission_timeout_s)
        except WindowFull:
            return None

    @property
    def window(self) -> int:
        return self.writer.window

    @property
    def terminal_error(self) -> BaseException | None:
        return self.writer.terminal_error

    # ---- hooks called by MasterService (under its lock) --------------------------------------
    def submit_put_ends(self, res: Reservation, rows: np.ndarray) -> None:
        """PUT_END of ``rows`` (one per reserved id), whose puts just completed: visible before
        durable, and never without an entry (the reservation was made before they completed)."""
        self.writer.submit(res, self._object_columns(rows, None))

    def hide_then_free(self, rows: np.ndarray, plan: "EvictionPlan | None" = None) -> int:
        """Mark the slots ``plan`` removes (default: every slot) of ``rows`` REMOVED, journal
        PUT_END(remaining)/REMOVE, and free them once durable, in window-sized reservations.
        Returns how many of ``rows`` (a prefix) were hidden; the others are unchanged because
        the window stayed full."""
        m = self.store
        o = m.objects
        done = 0
        while done < rows.size:
            part = rows[done: done + self.window]
            if plan is None:
                chain = o.chains(part).rows
                status = o.replica_status[chain]
                gone = status != ST_EMPTY
            else:
                sub = plan.part(done, done + part.size)
                chain, gone = sub.chains.rows, sub.removed
                status = o.replica_status[chain]
            remaining = (status != ST_EMPTY) & ~gone
            body = self._object_columns(part, remaining & (status == _COMPLETE))
            res = self.reserve(int(part.size))
            if res is None:
                break
            ids = np.where(gone, o.replica_id[chain], 0)
            r_idx, slot = np.nonzero(gone)
            m.charge(part, -1)  # the tenant ledger follows statuses: hidden bytes leave it now
            o.replica_status[chain[r_idx], slot] = _REMOVED  # hidden now: unreadable, not evictable
            m.charge(part, +1)

            def on_durable(_batch: object, p: np.ndarray = chain, i: np.ndarray = ids) -> None:
                self.finalize(p, i)
            self.writer.submit(res, body, on_durable=on_durable)
            done += part.size
        return done

    def segments(self, segs: Sequence[Segment], mounted: bool) -> "PendingEntries | None":
        """Reserve the SEGMENT_MOUNT (or UNMOUNT) entries of ``segs``; returns them pending:
        ``submit()`` once the change is made, ``cancel()`` if it failed. None when the window
        stayed full."""
        if not segs:
            return PendingEntries(None, None, self.writer)
        op = OpType.SEGMENT_MOUNT if mounted else OpType.SEGMENT_UNMOUNT
        body = OpLogColumns.from_ops([OpLogOp(op, "default", seg.endpoint or seg.name,
                                              SegmentPayload(seg.name, seg.endpoint, seg.size, seg.client,
                                                             seg.segment_id, seg.host_id))
                                      for seg in segs])
        res = self.reserve(len(segs))
        return None if res is None else PendingEntries(res, body, self.writer)


class PendingEntries:
    """Reserved entries whose change is being made: exactly one of submit() or cancel()."""

    def __init__(self, res: Reservation | None, body: OpLogColumns | None, writer: OpLogWriter) -> None:
        self._res, self._body, self._writer = res, body, writer

    def submit(self) -> None:
        if self._res is not None:
            assert self._body is not None  # reserved entries always come with their body
            self._writer.submit(self._res, self._body)

    def cancel(self) -> None:
        if self._res is not None:
            self._writer.cancel(self._res)
