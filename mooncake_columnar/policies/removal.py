"""Explicit removal: which objects may go (leases, completeness, force), erased now or, with a
journal, hidden now and freed once durable; and the revoke of an in-progress put."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import ErrorCode, error_for_code
from ..kernels import objects as ok
from ..schema import FLAG_PROCESSING, ST_PROCESSING, ReplicaStatus
from ..validation import raise_code

if TYPE_CHECKING:
    from .service import Service


def remove_keys(m: "Service", offsets: np.ndarray, data: np.ndarray, tenant_id: str,
                force: bool) -> np.ndarray:
    """Remove the keys ``offsets``/``data`` of a tenant: per-key codes."""
    s = m.store
    rows = s.lookup(offsets, data, tenant_id)
    codes = np.empty(rows.size, np.int32)
    o = s.objects
    ok.classify_removals(rows, m.clocks.steady_ns(), force, o.lease_deadline_ns, o.replica_status, codes,
                         o.replica_more)
    removed = np.flatnonzero(codes == 0)
    doomed, first = np.unique(rows[removed], return_index=True)
    repeat = np.ones(removed.size, np.bool_)
    repeat[first] = False
    codes[removed[repeat]] = ErrorCode.OBJECT_NOT_FOUND  # a repeated key: gone by its turn
    done = remove_objects(m, doomed)
    if done < doomed.size:  # oplog window stayed full: those objects were not touched
        codes[removed[np.isin(rows[removed], doomed[done:]) & ~repeat]] = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
    return codes


def remove_objects(m: "Service", rows: np.ndarray) -> int:
    """Erase now, or with a journal hide now and free once durable, in window-sized
    reservations. Returns how many of ``rows`` (a prefix) were removed; the rest are untouched
    (the oplog window stayed full)."""
    if m.journal is None:
        m.store.erase_rows(rows)
        return int(rows.size)
    done = m.journal.hide_then_free(rows)
    if done < rows.size:
        m.metrics.inc("remove_oplog_backpressure", int(rows.size - done))
    return done


def remove_rows_where_allowed(m: "Service", rows: np.ndarray, force: bool) -> int:
    """Remove the unleased (or, with force, all) complete objects of ``rows``; returns the
    count, or raises UNAVAILABLE_IN_CURRENT_STATUS when the oplog window stopped it."""
    o = m.store.objects
    codes = np.empty(rows.size, np.int32)
    ok.classify_removals(rows, m.clocks.steady_ns(), force, o.lease_deadline_ns, o.replica_status, codes,
                         o.replica_more)
    doomed = rows[codes == 0]
    done = remove_objects(m, doomed)
    if done < doomed.size:
        raise error_for_code(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS,
                             f"oplog window full: {done} of {doomed.size} objects removed, retry for the rest")
    return int(doomed.size)


def revoke(m: "Service", row: int, client: str, what: str) -> None:
    """Abort the in-progress put at ``row`` (-1: not found) of ``client``: its PROCESSING
    replicas are freed and the object erased."""
    s = m.store
    o = s.objects
    if row < 0:
        raise_code(ErrorCode.OBJECT_NOT_FOUND, what)
    if o.client[row] != s.clients.find(client):
        raise_code(ErrorCode.ILLEGAL_CLIENT, what)
    st = o.replica_status[o.chains(np.array([row], np.int64)).rows]
    in_use = st != int(ReplicaStatus.UNDEFINED)
    if not (o.flags[row] & FLAG_PROCESSING) or (st[in_use] != int(ST_PROCESSING)).any():
        raise_code(ErrorCode.INVALID_WRITE, f"{what}: not an in-progress put")
    s.erase_rows(np.array([row], np.int64))
