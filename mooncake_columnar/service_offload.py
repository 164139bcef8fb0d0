"""Offload-on-evict calls of a MasterService: queue instead of drop, completion, expiry."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .clock import NS_PER_MS
from .errors import ErrorCode, error_for_code
from .messages import DEFAULT_TENANT
from .schema import ReplicaKind
from .validation import _COMPLETE, _locked, _require_str, _single_key


class OffloadMixin:
    """Offload-on-evict part of a MasterService."""

    # ================================================================================ offload
    def _offload_instead(self, rows: np.ndarray, removed: np.ndarray) -> tuple[np.ndarray, int]:
        """Upstream try_evict_or_offload: objects without a LOCAL_DISK copy queue an offload of
        their first evictable memory replica (pinned by refcnt) instead of losing it."""
        o = self.objects
        has_disk = (o.replica_kind[rows] == int(ReplicaKind.LOCAL_DISK)).any(axis=1) & \
            (o.replica_status[rows] == _COMPLETE).any(axis=1)
        needs = np.flatnonzero(~has_disk & removed.any(axis=1))
        room = max(0, min(self.offloads.cycle_cap, self.offloads.limit - len(self.offloads)))
        queue_now, overflow = needs[:room], needs[room:]
        src_slot = removed[queue_now].argmax(axis=1)
        q_rows = rows[queue_now]
        o.replica_refcnt[q_rows, src_slot] += 1
        self.offloads.push(q_rows, src_slot, o.replica_id[q_rows, src_slot],
                           self.clocks.system_ns() // NS_PER_MS)
        removed = removed.copy()
        removed[queue_now, src_slot] = False  # the source stays; other evictable replicas go
        if not self.config.offload_force_evict:
            removed[overflow] = False         # queue full: keep the data rather than lose it
        self.metrics.inc("offloads_queued", queue_now.size)
        return removed, int(queue_now.size)

    @_locked
    def offload_tasks(self) -> pa.Table:
        """Queued offloads: which key's replica to copy to its owner's local disk."""
        q = self.offloads
        o = self.objects
        return pa.table({"tenant": self.tenants.decode(o.tenant[q.rows]),
                         "key": self.keys.keys_of(q.rows).cast(pa.string()),
                         "client": self.clients.decode(o.client[q.rows]),
                         "replica_id": q.replica_ids, "size": o.size_bytes[q.rows]})

    @_locked
    def complete_offload(self, key: str, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> None:
        """The client copied the object to local disk: add the LOCAL_DISK replica, unpin the source."""
        offsets, data = _single_key(key)
        row = int(self._lookup(offsets, data, tenant_id)[0])
        pos = self.offloads.position_of(row) if row >= 0 else -1
        if pos < 0:
            raise error_for_code(ErrorCode.OBJECT_NO_REPLICATION_TASK, f"no offload queued for {key!r}")
        client = self.clients.code(_require_str("client_id", client_id))
        res = None
        if self.journal is not None:  # the new replica is journaled, or not added at all
            res = self.journal.reserve(1)
            if res is None:
                raise error_for_code(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS, "oplog window full: retry")
        o = self.objects
        free_slot = np.flatnonzero(o.replica_status[row] == 0)
        if free_slot.size == 0:
            o.ensure_slots(o.slots + 1)
            free_slot = np.array([o.slots - 1])
        j = int(free_slot[0])
        o.replica_status[row, j] = _COMPLETE
        o.replica_kind[row, j] = int(ReplicaKind.LOCAL_DISK)
        o.replica_segment[row, j] = client
        o.replica_id[row, j] = self.next_replica_id
        self.next_replica_id += 1
        o.replica_refcnt[row, self.offloads.slots[pos]] -= 1
        self.offloads.keep(np.arange(len(self.offloads)) != pos)
        if res is not None:  # PUT_END with every complete replica, the new LOCAL_DISK one included
            self.journal.submit_put_ends(self, res, np.array([row], np.int64))

    def _expire_offloads(self, now_ms: int) -> None:
        q = self.offloads
        late = q.start_ms + self.config.put_start_release_timeout_s * 1000 < now_ms
        if late.any():
            self.objects.replica_refcnt[q.rows[late], q.slots[late]] -= 1
            q.keep(~late)

