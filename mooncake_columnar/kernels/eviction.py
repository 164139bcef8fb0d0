"""Eviction kernels: census, deterministic k-earliest selection, plan with group expansion.

All object/replica decisions go through :mod:`.predicates`; nothing here compares lease deadlines
or tests flag bits itself. Kernels release the GIL so a background eviction thread does not
stall the embedding process.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .predicates import (is_eviction_candidate, is_evictable_memory_replica, is_grouped,
                         is_hard_pinned, is_live, is_unreadable_memory_replica, lease_expired,
                         object_has_evictable_memory_replica, slot_in_use, soft_pin_active)


NOT_IN_BASE, IN_BASE, NO_PIN_CANDIDATE, SOFT_PINNED_CANDIDATE = 0, 1, 2, 3
_CHUNKS = 64


@njit(cache=True, nogil=True, parallel=True)
def census_codes(now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline,
                 status, kind, segment, refcnt, seg_readable):
    """Classify every row (in parallel chunks): NOT_IN_BASE, IN_BASE (evictable replica, lease
    live), NO_PIN_CANDIDATE or SOFT_PINNED_CANDIDATE (lease expired). Also counts the complete
    memory replicas kept out only by readability (the RFC guard's skipped replicas)."""
    codes = np.zeros(rows_hw, np.uint8)
    chunk = (rows_hw + _CHUNKS - 1) // _CHUNKS
    skipped = np.zeros(_CHUNKS, np.int64)
    for c in prange(_CHUNKS):
        local_skipped = 0
        for r in range(c * chunk, min(rows_hw, (c + 1) * chunk)):
            f = flags[r]
            if not is_live(f) or is_hard_pinned(f):
                continue
            if only_tenant >= 0 and tenant[r] != only_tenant:
                continue
            if not object_has_evictable_memory_replica(r, status, kind, segment, refcnt, seg_readable):
                if lease_expired(lease[r], now):
                    for j in range(status.shape[1]):
                        if is_unreadable_memory_replica(status[r, j], kind[r, j], segment[r, j], refcnt[r, j],
                                                        seg_readable):
                            local_skipped += 1
                continue
            if not lease_expired(lease[r], now):
                codes[r] = IN_BASE
            elif soft_pin_active(f, soft_deadline[r], now):
                codes[r] = SOFT_PINNED_CANDIDATE
            else:
                codes[r] = NO_PIN_CANDIDATE
        skipped[c] = local_skipped
    return codes, skipped.sum()


def census(now: int, allow_soft: bool, rows_hw: int, tenant, only_tenant: int, flags, lease, soft_deadline,
           status, kind, segment, refcnt, seg_readable):
    """(eviction base, no-pin candidate rows, soft-pinned candidate rows, unreadable replicas
    skipped); ``only_tenant`` >= 0 restricts everything to one tenant."""
    codes, skipped = census_codes(now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline,
                                  status, kind, segment, refcnt, seg_readable)
    base = rows_hw - int(np.count_nonzero(codes == NOT_IN_BASE))
    nopin = np.flatnonzero(codes == NO_PIN_CANDIDATE)
    soft = np.flatnonzero(codes == SOFT_PINNED_CANDIDATE) if allow_soft else np.zeros(0, np.int64)
    return base, nopin, soft, int(skipped)


_SAMPLE = 1 << 16


@njit(cache=True, nogil=True)
def _at_most(rows, lease, bound):
    """Rows whose deadline is <= bound, in input order (one pass, no gathered copy)."""
    out = np.empty(rows.shape[0], np.int64)
    n = 0
    for i in range(rows.shape[0]):
        if lease[rows[i]] <= bound:
            out[n] = rows[i]
            n += 1
    return out[:n]


def earliest_first(rows: np.ndarray, lease: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` rows with the earliest lease, sorted by (lease, row): deterministic on ties.

    ``rows`` must be ascending (census output). A strided sample of the deadlines bounds the
    k-th one, one pass keeps the rows at or below that bound, and only they are partitioned and
    sorted; when the sample misjudges (too few kept) the whole set is used, so the result never
    depends on the sample.
    """
    if k <= 0 or rows.size == 0:
        return rows[:0]
    k = min(k, rows.size)
    if k < rows.size // 4 and rows.size > 4 * _SAMPLE:
        sample = np.sort(lease[rows[:: rows.size // _SAMPLE]])
        kept = _at_most(rows, lease, sample[min(sample.size - 1, int(sample.size * k / rows.size * 1.25) + 64)])
        if kept.size >= k:
            rows = kept
    keys = lease[rows]
    if k < rows.size:
        kth = keys[np.argpartition(keys, k - 1)[k - 1]]
        rows = _at_most(rows, lease, kth)
        keys = lease[rows]
    return rows[np.argsort(keys, kind="stable")][:k]  # stable: ties stay in (ascending) row order


@njit(cache=True, nogil=True)
def _member_blocks_group(r, now, lease, flags, group_next):
    """Upstream: one member with a live lease protects its whole group."""
    m = r
    while True:
        if not lease_expired(lease[m], now):
            return True
        m = group_next[m]
        if m == r:
            return False


@njit(cache=True, nogil=True)
def _evictable_bytes(r, sizes, status, kind, segment, refcnt, seg_readable):
    n = 0
    for j in range(status.shape[1]):
        if is_evictable_memory_replica(status[r, j], kind[r, j], segment[r, j], refcnt[r, j], seg_readable):
            n += 1
    return n * sizes[r]


@njit(cache=True, nogil=True)
def plan(ordered, want, want_bytes, now, allow_soft, taken, flags, lease, soft_deadline, group_next,
         sizes, status, kind, segment, refcnt, seg_readable):
    """Walk census candidates in order until ``want`` objects (or ``want_bytes`` of evictable
    memory, tenant quota) are planned; a grouped candidate brings every safe member of its
    group, or nothing when one member still holds a lease.

    ``ordered`` comes from this cycle's census (same ``now``, same lock), so plain candidates are
    taken as they are; group members, which the census did not order, are checked with the
    shared predicate here, and every planned row is re-validated by :func:`finalize`.
    ``taken`` marks rows already planned (shared across passes): 1 planned by a no-pin pass,
    2 by the soft-pinned fallback. Returns (rows planned, bytes).
    """
    n = 0
    freed = 0
    mark = np.uint8(2 if allow_soft else 1)
    count_bytes = want_bytes < 9223372036854775807
    for i in range(ordered.shape[0]):
        if n >= want or freed >= want_bytes:
            break
        r = ordered[i]
        if taken[r]:
            continue
        if not is_grouped(flags[r]):
            taken[r] = mark
            n += 1
            if count_bytes:
                freed += _evictable_bytes(r, sizes, status, kind, segment, refcnt, seg_readable)
            continue
        if _member_blocks_group(r, now, lease, flags, group_next):
            continue
        m = r
        while True:  # safe members go; hard- or soft-pinned ones stay
            if not taken[m] and is_eviction_candidate(m, now, allow_soft, flags, lease, soft_deadline,
                                                     status, kind, segment, refcnt, seg_readable):
                taken[m] = mark
                n += 1
                if count_bytes:
                    freed += _evictable_bytes(m, sizes, status, kind, segment, refcnt, seg_readable)
            m = group_next[m]
            if m == r:
                break
    return n, freed


@njit(cache=True, nogil=True)
def finalize(rows, taken, now, flags, lease, soft_deadline, status, kind, segment, refcnt,
             seg_readable, keep, removed, remaining):
    """Re-validate planned rows (sorted by row: a streaming pass) with the shared predicate and
    mark, per row, the replicas eviction drops and those that remain (oplog PUT_END(remaining)).
    """
    for i in range(rows.shape[0]):
        r = rows[i]
        keep[i] = is_eviction_candidate(r, now, taken[r] == 2, flags, lease, soft_deadline,
                                        status, kind, segment, refcnt, seg_readable)
        for j in range(status.shape[1]):
            drop = keep[i] and is_evictable_memory_replica(status[r, j], kind[r, j], segment[r, j],
                                                           refcnt[r, j], seg_readable)
            removed[i, j] = drop
            remaining[i, j] = slot_in_use(status[r, j]) and not drop
