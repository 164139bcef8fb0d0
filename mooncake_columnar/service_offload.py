"""Offload-on-evict calls of a MasterService: queue instead of drop, completion, expiry."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from .clock import NS_PER_MS
from .errors import ErrorCode, error_for_code
from .kernels.predicates import readable_replica_mask
from .messages import DEFAULT_TENANT
from .schema import ReplicaKind
from .validation import _COMPLETE, _locked, _single_key

if TYPE_CHECKING:
    from .eviction import EvictionPlan


class OffloadMixin:
    """Offload-on-evict part of a MasterService."""

    # ================================================================================ offload
    def _offload_instead(self, plan: "EvictionPlan") -> tuple["EvictionPlan", int]:
        """Upstream try_evict_or_offload: objects without a LOCAL_DISK copy queue an offload of
        their first evictable memory replica (pinned by refcnt) instead of losing it."""
        o, chains = self.objects, plan.chains
        kind, rows = o.replica_kind[chains.rows], chains.rows  # a readable LOCAL_DISK replica: COMPLETE
        has_disk = chains.any((kind == int(ReplicaKind.LOCAL_DISK)) & readable_replica_mask(
            o.replica_status[rows], kind, o.replica_segment[rows], self.segments.readable))
        needs = np.flatnonzero(~has_disk & chains.any(plan.removed))
        room = max(0, min(self.offloads.cycle_cap, self.offloads.limit - len(self.offloads)))
        queue_now, overflow = needs[:room], needs[room:]
        k, j = np.nonzero(plan.removed)                 # in chain order: an object's first comes first
        objects, first = np.unique(chains.owner[k], return_index=True)
        src = first[np.searchsorted(objects, queue_now)]
        src_row, src_slot = chains.rows[k[src]], j[src]
        o.replica_refcnt[src_row, src_slot] += 1
        self.offloads.push(plan.rows[queue_now], src_row, src_slot, o.replica_id[src_row, src_slot],
                           self.clocks.system_ns() // NS_PER_MS)
        removed = plan.removed.copy()
        removed[k[src], src_slot] = False     # the source stays; other evictable replicas go
        if not self.config.offload_force_evict:
            removed[np.isin(chains.owner, overflow)] = False  # queue full: keep the data rather than lose it
        self.metrics.inc("offloads_queued", queue_now.size)
        return replace(plan, removed=removed), int(queue_now.size)

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
        client = self.clients.code(self._require_client(client_id))
        res = None
        if self.journal is not None:  # the new replica is journaled, or not added at all
            res = self.journal.reserve(1)
            if res is None:
                raise error_for_code(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS, "oplog window full: retry")
        o = self.objects
        chain = o.chains(np.array([row], np.int64)).rows
        free_row, free_slot = np.nonzero(o.replica_status[chain] == 0)
        if free_row.size:
            r, j = int(chain[free_row[0]]), int(free_slot[0])
        else:  # every slot taken: a continuation row, not a wider table
            r, j = int(o.add_continuations(np.array([row], np.int64))[0]), 0
        o.replica_status[r, j] = _COMPLETE
        o.replica_kind[r, j] = int(ReplicaKind.LOCAL_DISK)
        o.replica_segment[r, j] = client
        o.replica_id[r, j] = self.next_replica_id
        self.next_replica_id += 1
        o.replica_refcnt[self.offloads.slot_rows[pos], self.offloads.slots[pos]] -= 1
        self.offloads.keep(np.arange(len(self.offloads)) != pos)
        if res is not None:  # PUT_END with every complete replica, the new LOCAL_DISK one included
            self.journal.submit_put_ends(self, res, np.array([row], np.int64))

    def _expire_offloads(self, now_ms: int) -> None:
        q = self.offloads
        late = q.start_ms + self.config.put_start_release_timeout_s * 1000 < now_ms
        if late.any():
            self.objects.replica_refcnt[q.slot_rows[late], q.slots[late]] -= 1
            q.keep(~late)

