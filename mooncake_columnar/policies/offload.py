"""Offload on evict: queue a copy to the owner's local disk instead of dropping a replica, add
the LOCAL_DISK replica on completion, expire tasks not completed in time."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..clock import NS_PER_MS
from ..errors import ErrorCode, error_for_code
from ..kernels.predicates import readable_replica_mask
from ..schema import ST_COMPLETE, ST_EMPTY, ReplicaKind
from ..store.metadata import MetadataStore
from .segments import require_client

if TYPE_CHECKING:
    from .service import Service
    from ..store.eviction_plan import EvictionPlan


def offload_instead(m: "Service", plan: "EvictionPlan") -> tuple["EvictionPlan", int]:
    """Upstream try_evict_or_offload: objects without a LOCAL_DISK copy queue an offload of
    their first evictable memory replica (pinned by refcnt) instead of losing it."""
    o, chains, offloads = m.store.objects, plan.chains, m.store.offloads
    kind, rows = o.replica_kind[chains.rows], chains.rows  # a readable LOCAL_DISK replica: COMPLETE
    has_disk = chains.any((kind == int(ReplicaKind.LOCAL_DISK)) & readable_replica_mask(
        o.replica_status[rows], kind, o.replica_segment[rows], m.store.segments.readable))
    needs = np.flatnonzero(~has_disk & chains.any(plan.removed))
    room = max(0, min(offloads.cycle_cap, offloads.limit - len(offloads)))
    queue_now, overflow = needs[:room], needs[room:]
    k, j = np.nonzero(plan.removed)                 # in chain order: an object's first comes first
    objects, first = np.unique(chains.owner[k], return_index=True)
    src = first[np.searchsorted(objects, queue_now)]
    src_row, src_slot = chains.rows[k[src]], j[src]
    o.replica_refcnt[src_row, src_slot] += 1
    offloads.push(plan.rows[queue_now], src_row, src_slot, o.replica_id[src_row, src_slot],
                  m.clocks.system_ns() // NS_PER_MS)
    removed = plan.removed.copy()
    removed[k[src], src_slot] = False     # the source stays; other evictable replicas go
    if not m.config.offload_force_evict:
        removed[np.isin(chains.owner, overflow)] = False  # queue full: keep the data rather than lose it
    m.metrics.inc("offloads_queued", queue_now.size)
    return replace(plan, removed=removed), int(queue_now.size)


def offload_tasks(store: MetadataStore) -> pa.Table:
    """Queued offloads: which key's replica to copy to its owner's local disk."""
    q, o = store.offloads, store.objects
    return pa.table({"tenant": store.tenants.decode(o.tenant[q.rows]),
                     "key": store.keys.keys_of(q.rows).cast(pa.string()),
                     "client": store.clients.decode(o.client[q.rows]),
                     "replica_id": q.replica_ids, "size": o.size_bytes[q.rows]})


def complete_offload(m: "Service", row: int, client_id: str, what: str) -> None:
    """The client copied the object at ``row`` (-1: not found) to local disk: add its
    LOCAL_DISK replica (journaled, or not added at all) and unpin the source."""
    s = m.store
    pos = s.offloads.position_of(row) if row >= 0 else -1
    if pos < 0:
        raise error_for_code(ErrorCode.OBJECT_NO_REPLICATION_TASK, f"no offload queued for {what}")
    client_code = s.clients.code(require_client(m.config, client_id))
    res = None
    if m.journal is not None:
        res = m.journal.reserve(1)
        if res is None:
            raise error_for_code(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS, "oplog window full: retry")
    o = s.objects
    chain = o.chains(np.array([row], np.int64)).rows
    free_row, free_slot = np.nonzero(o.replica_status[chain] == ST_EMPTY)
    if free_row.size:
        r, j = int(chain[free_row[0]]), int(free_slot[0])
    else:  # every slot taken: a continuation row, not a wider table
        r, j = int(o.add_continuations(np.array([row], np.int64))[0]), 0
    o.replica_status[r, j] = ST_COMPLETE
    o.replica_kind[r, j] = int(ReplicaKind.LOCAL_DISK)
    o.replica_segment[r, j] = client_code
    o.replica_offset[r, j] = 0  # a local-disk copy has no offset (a freed slot keeps its last value)
    o.replica_id[r, j] = s.next_replica_id
    s.next_replica_id += 1
    o.replica_refcnt[s.offloads.slot_rows[pos], s.offloads.slots[pos]] -= 1
    s.offloads.keep(np.arange(len(s.offloads)) != pos)
    if res is not None:  # PUT_END with every complete replica, the new LOCAL_DISK one included
        assert m.journal is not None  # res was reserved from it
        m.journal.submit_put_ends(res, np.array([row], np.int64))


def expire_offloads(store: MetadataStore, timeout_ms: int, now_ms: int) -> None:
    """Drop tasks queued more than ``timeout_ms`` ago, unpinning their sources."""
    q = store.offloads
    late = q.start_ms + timeout_ms < now_ms
    if late.any():
        store.objects.replica_refcnt[q.slot_rows[late], q.slots[late]] -= 1
        q.keep(~late)
