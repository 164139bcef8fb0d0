"""The ONE definition of readability, lease expiry, soft-pin activity and memory-evictability.

Every path that decides readability or eviction (reads, census, re-validation, mutation, oplog
remaining-descriptor prediction, offload source choice, tenant quota eviction, group members)
calls these functions; nothing else tests the flag bits or compares lease deadlines itself.

They test one condition per ``if`` and return early: Numba compiles ``and``/``or`` chains
several times slower inside hot loops.
"""
from __future__ import annotations

from numba import njit

from .chains import next_row

from ..schema import (FLAG_ERASE_MARK, FLAG_GROUP_REFRESH, FLAG_GROUPED, FLAG_HARD_PINNED, FLAG_LIVE,
                      FLAG_PENDING_SOFT_PIN, FLAG_PROCESSING, FLAG_SOFT_PIN_ENABLED, KIND_MEMORY,
                      ST_COMPLETE, ST_EMPTY, ST_PROCESSING, ST_REMOVED)

_COMPLETE = int(ST_COMPLETE)
_PROCESSING = int(ST_PROCESSING)
_REMOVED = int(ST_REMOVED)
_EMPTY = int(ST_EMPTY)
_MEMORY = int(KIND_MEMORY)
_HARD = int(FLAG_HARD_PINNED)
_SOFT = int(FLAG_SOFT_PIN_ENABLED)
_LIVE = int(FLAG_LIVE)
_GROUPED = int(FLAG_GROUPED)
_REFRESH = int(FLAG_GROUP_REFRESH)
_PROC_FLAG = int(FLAG_PROCESSING)
_PENDING = int(FLAG_PENDING_SOFT_PIN)
_ERASE_MARK = int(FLAG_ERASE_MARK)


@njit(inline="always", cache=True)
def is_readable_replica(status, kind, segment, segment_readable):
    """COMPLETE, and a memory replica's segment is mounted with a valid endpoint."""
    if status != _COMPLETE:
        return False
    if kind != _MEMORY:
        return True
    if segment < 0:
        return False
    return segment_readable[segment]


@njit(inline="always", cache=True)
def is_evictable_memory_replica(status, kind, segment, refcnt, segment_readable):
    """Memory kind, COMPLETE, readable and not pinned as a copy/offload source. No TTL."""
    if kind != _MEMORY:
        return False
    if refcnt != 0:
        return False
    return is_readable_replica(status, kind, segment, segment_readable)


@njit(inline="always", cache=True)
def is_unreadable_memory_replica(status, kind, segment, refcnt, segment_readable):
    """A complete, unpinned memory replica kept out of eviction only by readability (RFC guard)."""
    if kind != _MEMORY:
        return False
    if status != _COMPLETE:
        return False
    if refcnt != 0:
        return False
    return not is_evictable_memory_replica(status, kind, segment, refcnt, segment_readable)


@njit(inline="always", cache=True)
def slot_in_use(status):
    return status != _EMPTY


@njit(inline="always", cache=True)
def slot_is_processing(status):
    return status == _PROCESSING


@njit(inline="always", cache=True)
def slot_is_complete(status):
    return status == _COMPLETE


@njit(inline="always", cache=True)
def slot_is_removed(status):
    return status == _REMOVED


@njit(inline="always", cache=True)
def lease_expired(lease_deadline, now):
    """Upstream IsLeaseExpired: now >= deadline (NEVER_LEASED is always expired)."""
    return now >= lease_deadline


@njit(inline="always", cache=True)
def soft_pin_active(flags, soft_pin_deadline, now):
    """Soft pin protects only while enabled AND inside its current interval."""
    if not is_soft_pin_enabled(flags):
        return False
    return now < soft_pin_deadline


@njit(inline="always", cache=True)
def is_soft_pin_enabled(flags):
    """Participates in soft-pin policy (the interval may have expired)."""
    return (flags & _SOFT) != 0


@njit(inline="always", cache=True)
def is_hard_pinned(flags):
    return (flags & _HARD) != 0


@njit(inline="always", cache=True)
def is_live(flags):
    return (flags & _LIVE) != 0


@njit(inline="always", cache=True)
def is_erase_marked(flags):
    """Scratch bit of the erase guard: this row was already named in the current erase."""
    return (flags & _ERASE_MARK) != 0


@njit(inline="always", cache=True)
def is_grouped(flags):
    return (flags & _GROUPED) != 0


@njit(inline="always", cache=True)
def group_awaits_refresh(flags):
    return (flags & _REFRESH) != 0


@njit(inline="always", cache=True)
def is_put_in_flight(flags):
    """In upstream's processing_keys: some replica of the put is still PROCESSING."""
    return (flags & _PROC_FLAG) != 0


@njit(inline="always", cache=True)
def has_pending_soft_pin(flags):
    return (flags & _PENDING) != 0



@njit(inline="always", cache=True)
def object_has_evictable_memory_replica(row, status, kind, segment, refcnt, segment_readable, more):
    while row >= 0:
        for j in range(status.shape[1]):
            if is_evictable_memory_replica(status[row, j], kind[row, j], segment[row, j], refcnt[row, j],
                                           segment_readable):
                return True
        row = next_row(more, row)
    return False


@njit(inline="always", cache=True)
def is_eviction_candidate(row, now, allow_soft_pinned, flags, lease, soft_deadline,
                          status, kind, segment, refcnt, segment_readable, more):
    """Object-level memory-eviction candidate at the sampled ``now``."""
    f = flags[row]
    if is_hard_pinned(f):
        return False
    if not lease_expired(lease[row], now):
        return False
    if not allow_soft_pinned:
        if soft_pin_active(f, soft_deadline[row], now):
            return False
    return object_has_evictable_memory_replica(row, status, kind, segment, refcnt, segment_readable, more)
