"""Memory floors, for `bench core` and `bench evict`: what this machine's memory allows.

**Batch get** (:func:`gather_keys_per_s`): this machine's rate of random reads.

A batch get of random keys reads, per key, the key's home slot in the index table, the
candidate row's key ref and tenant, the key's bytes in the arena, and the row's flags, lease
and replica columns: a dozen cache lines at unrelated addresses. :func:`gather_keys_per_s`
reads exactly those values for the same keys, with each key's home slot and row known in
advance, in a parallel loop on the same threads that does nothing else (no hashing, no key
compare, no lease write, no output). No lookup can be faster on this machine, so a keys/s
target above this floor cannot be met here.

**Eviction** (:func:`eviction_read_seconds`): a cycle classifies every row (its flags, lease and
replica columns) and deletes its victims from the key index in one pass over the index table.
The floor reads exactly those arrays once, in parallel chunks, and does nothing else; the
victims' own reads and writes come on top of it.
"""
from __future__ import annotations

import time

import numpy as np
from numba import prange

from ..kernels.jit import njit
from ..kernels import hashing as hk
from ..master import MasterService
from ..messages import DEFAULT_TENANT
from ..store.keys import as_string_array, string_buffers


@njit(cache=True)
def _home_slots(offsets, data, tenant, size):
    out = np.empty(offsets.shape[0] - 1, np.int64)
    for i in range(out.shape[0]):
        h = hk.hash_key(data, offsets[i], offsets[i + 1] - offsets[i], tenant)
        out[i] = hk.home_slot(h, size)
    return out


@njit(cache=True, nogil=True, parallel=True)
def _gather(slots, rows, table, key_refs, row_tenant, arena, flags, lease, rep_status, rep_kind, rep_seg,
            rep_id, rep_offset, size_bytes):
    total = 0
    for i in prange(rows.shape[0]):
        r = rows[i]
        ref = key_refs[r]
        total += (table[slots[i]] + ref + row_tenant[r] + arena[hk.ref_offset(ref)] + flags[r] + lease[r]
                  + rep_status[r, 0] + rep_kind[r, 0] + rep_seg[r, 0] + np.int64(rep_id[r, 0])
                  + rep_offset[r, 0] + size_bytes[r])
    return total


def gather_keys_per_s(m: MasterService, keys, repeats: int = 3) -> float:
    """Keys per second of the floor above for ``keys`` (all present in ``m``); best of ``repeats``."""
    offsets, data = string_buffers(as_string_array(keys))
    tenant = m.tenants.find(DEFAULT_TENANT)
    store, o = m.store, m.objects
    rows = store.keys.lookup_batch(offsets, data, np.array([tenant], np.int32))
    if rows.size and rows.min() < 0:
        raise ValueError("gather_keys_per_s: every key must be present")
    slots = _home_slots(offsets, data, np.int16(tenant), store.keys.table.shape[0])
    args = (store.keys.table, o.key_ref, o.tenant, store.keys.arena, o.flags, o.lease_deadline_ns,
            o.replica_status, o.replica_kind, o.replica_segment, o.replica_id, o.replica_offset, o.size_bytes)
    _gather(slots[:1], rows[:1], *args)  # compiled before the clock starts
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _gather(slots, rows, *args)
        best = min(best, time.perf_counter() - t0)
    return rows.size / best


@njit(cache=True, nogil=True, parallel=True)
def _read_rows(n, flags, lease, rep_status, rep_kind, rep_seg, rep_refcnt, table):
    chunks = 64
    per = (n + chunks - 1) // chunks
    slots_per = (table.shape[0] + chunks - 1) // chunks
    sums = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        total = np.int64(0)
        for r in range(c * per, min(n, (c + 1) * per)):
            total += flags[r] + lease[r]
            for j in range(rep_status.shape[1]):
                total += rep_status[r, j] + rep_kind[r, j] + rep_seg[r, j] + rep_refcnt[r, j]
        for i in range(c * slots_per, min(table.shape[0], (c + 1) * slots_per)):
            total += table[i]
        sums[c] = total
    return sums.sum()


def eviction_read_seconds(m: MasterService, repeats: int = 3, *, rows: bool = True, index: bool = True) -> float:
    """Seconds of the eviction floor above for ``m``; best of ``repeats``. ``rows=False`` or
    ``index=False`` leaves out the row columns (the census's part) or the index table (the key
    delete's part), so each pass of a cycle can be set beside its own floor."""
    o = m.objects
    table = m.store.keys.table
    args = (o.high_water if rows else 0, o.flags, o.lease_deadline_ns, o.replica_status, o.replica_kind,
            o.replica_segment, o.replica_refcnt, table if index else table[:0])
    _read_rows(0, *args[1:-1], table[:0])  # compiled before the clock starts (reading nothing)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _read_rows(*args)
        best = min(best, time.perf_counter() - t0)
    return best
