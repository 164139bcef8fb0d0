"""Primary side of the oplog: what MasterService appends, and when it may free space.

Upstream's protocol: readability-increasing operations (PUT_END, SEGMENT_MOUNT) are visible before
they are durable; readability-decreasing ones (REMOVE, eviction) hide first (replicas marked
REMOVED, so reads and eviction skip them) and free their space only after the entries are
durable. A full writer window refuses the reservation before anything is mutated: removal fails
with the error, eviction stops its cycle and stays armed. No deadline ever goes into an entry.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import WindowFull
from ..schema import FLAG_HARD_PINNED, FLAG_SOFT_PIN_ENABLED, KIND_MEMORY, ReplicaStatus
from ..store.segments import Segment
from .oplog import OpLogOp, OpType, SegmentPayload, trusted_op, trusted_put_end, trusted_replica
from .writer import OpLogWriter

if TYPE_CHECKING:
    from ..master import MasterService

log = logging.getLogger(__name__)
_REMOVED = int(ReplicaStatus.REMOVED)
_COMPLETE = int(ReplicaStatus.COMPLETE)
_MEMORY = int(KIND_MEMORY)


class Journal:
    def __init__(self, writer: OpLogWriter) -> None:
        self.writer = writer

    # ---- ops -------------------------------------------------------------------------------
    def _object_ops(self, m: "MasterService", rows: np.ndarray, keep: np.ndarray | None) -> list[OpLogOp]:
        """One op per row: PUT_END carrying the replicas that stay (``keep`` mask over slots,
        default: the COMPLETE ones), or REMOVE when none stays. Columns are gathered once."""
        o = m.objects
        if keep is None:
            keep = o.replica_status[rows] == _COMPLETE
        keys = m.keys.keys_of(rows).to_pylist()
        tenants = [m.tenants.name(c) for c in o.tenant[rows].tolist()]
        clients = [m.clients.name(c) for c in o.client[rows].tolist()]
        sizes = o.size_bytes[rows].tolist()
        dtypes = o.data_type[rows].tolist()
        flags = o.flags[rows].tolist()
        kinds, segs = o.replica_kind[rows].tolist(), o.replica_segment[rows].tolist()
        offs, ids = o.replica_offset[rows].tolist(), o.replica_id[rows].tolist()
        keep_l = keep.tolist()
        names = [s.name if s else "" for s in m.segments.info]
        ops = []
        for i, row in enumerate(rows.tolist()):
            reps = tuple(trusted_replica(ids[i][j], kinds[i][j], names[segs[i][j]] if kinds[i][j] == _MEMORY else "",
                                         offs[i][j], sizes[i], _COMPLETE)
                         for j, k in enumerate(keep_l[i]) if k)
            if not reps:
                ops.append(trusted_op(OpType.REMOVE, tenants[i], keys[i], None))
                continue
            ops.append(trusted_op(OpType.PUT_END, tenants[i], keys[i], trusted_put_end(
                clients[i], sizes[i], reps, dtypes[i], m._group_name(row),
                bool(flags[i] & FLAG_HARD_PINNED), bool(flags[i] & FLAG_SOFT_PIN_ENABLED))))
        return ops

    def _try_reserve(self, n: int):
        try:
            return self.writer.reserve(n)
        except WindowFull:
            return None

    # ---- hooks called by MasterService (under its lock) --------------------------------------
    def put_end(self, m: "MasterService", rows: np.ndarray) -> None:
        """Visible before durable: append PUT_END for completed objects, nothing waits."""
        if rows.size == 0:
            return
        res = self._try_reserve(int(rows.size))
        if res is None:  # upstream logs and carries on: the object is already visible
            m.metrics.inc("oplog_put_end_dropped", int(rows.size))
            log.warning("oplog window full: %d PUT_END entries not journaled", rows.size)
            return
        self.writer.submit(res, self._object_ops(m, rows, None))

    def hide_then_free(self, m: "MasterService", rows: np.ndarray, removed: np.ndarray | None = None) -> bool:
        """Mark the ``removed`` slots (default: every slot) of ``rows`` REMOVED, journal
        PUT_END(remaining)/REMOVE, and free them once durable. False (nothing changed) when the
        writer window is full."""
        if rows.size == 0:
            return True
        o = m.objects
        if removed is None:
            removed = o.replica_status[rows] != 0
        res = self._try_reserve(int(rows.size))
        if res is None:
            return False
        remaining = (o.replica_status[rows] != 0) & ~removed
        ops = self._object_ops(m, rows, remaining & (o.replica_status[rows] == _COMPLETE))
        ids = np.where(removed, o.replica_id[rows], 0)
        r_idx, slot = np.nonzero(removed)
        o.replica_status[rows[r_idx], slot] = _REMOVED  # hidden now: unreadable, not evictable
        self.writer.submit(res, ops, on_durable=lambda _entries: m._finalize_removed(rows, ids))
        return True

    def segment(self, m: "MasterService", seg: Segment, mounted: bool) -> None:
        op = OpType.SEGMENT_MOUNT if mounted else OpType.SEGMENT_UNMOUNT
        res = self._try_reserve(1)
        if res is None:
            m.metrics.inc("oplog_segment_ops_dropped")
            log.warning("oplog window full: %s %s not journaled", op.name, seg.name)
            return
        self.writer.submit(res, [OpLogOp(op, "default", seg.endpoint or seg.name,
                                         SegmentPayload(seg.name, seg.endpoint, seg.size, seg.client))])


def finalize_removed(m: "MasterService", rows: np.ndarray, ids: np.ndarray) -> Sequence[int]:
    """Free the REMOVED slots whose replica ids still match (rows may have been recycled since);
    erase objects left without replicas. Returns the rows erased."""
    o = m.objects
    status = o.replica_status[rows]
    match = (ids != 0) & (o.replica_id[rows] == ids) & (status == _REMOVED)
    r_idx, slot = np.nonzero(match)
    m._drop_slots(rows[r_idx], slot)
    gone = np.unique(rows[match.any(axis=1) & ~(o.replica_status[rows] != 0).any(axis=1)])
    m._erase_rows(gone)
    return gone
