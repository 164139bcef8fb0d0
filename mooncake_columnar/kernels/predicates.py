"""The ONE definition of readability, lease expiry, soft-pin activity and memory-evictability.

Every path that decides readability or eviction (reads, census, re-validation, mutation, oplog
remaining-descriptor prediction, offload source choice, tenant quota eviction, group members)
calls these functions; nothing else tests the flag bits or compares lease deadlines itself.

They test one condition per ``if`` and return early: Numba compiles ``and``/``or`` chains
several times slower inside hot loops. The ``*_mask`` functions at the end are the same
predicates over whole NumPy columns, for the vectorised paths outside kernels.
"""
from __future__ import annotations

import numpy as np
from .jit import njit

from .chains import next_row
from .slot_index import slot_value

from ..schema import (NO_DEADLINE, FLAG_ERASE_MARK, FLAG_GROUP_REFRESH, FLAG_GROUPED, FLAG_HARD_PINNED, FLAG_LIVE,
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
_NO_DEADLINE = np.int64(NO_DEADLINE)


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
def memory_segment(kind, segment):
    """The segment of a slot known in use when it holds a memory replica; -1 otherwise (scalar
    :func:`memory_on_segment_mask`)."""
    if kind != _MEMORY:
        return -1
    return segment


@njit(inline="always", cache=True)
def memory_replica_segment(status, kind, segment):
    """The segment code of the memory replica a slot holds; -1 when it holds none."""
    if not slot_in_use(status):
        return -1
    return memory_segment(kind, segment)


@njit(inline="always", cache=True)
def is_memory_replica_on(status, kind, segment, on_segment):
    """A slot in use holding a memory replica on a segment flagged in ``on_segment``."""
    s = memory_replica_segment(status, kind, segment)
    if s < 0:
        return False
    return on_segment[s]


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
def soft_pin_active(flags, soft, row, now):
    """Soft pin protects only while enabled AND inside its current interval (the deadline of
    ``row`` in ``soft``, a SoftPinTable's parts(): read only for a soft-pinned object)."""
    if not is_soft_pin_enabled(flags):
        return False
    return now < slot_value(soft, row, _NO_DEADLINE)


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
        if soft_pin_active(f, soft_deadline, row, now):
            return False
    return object_has_evictable_memory_replica(row, status, kind, segment, refcnt, segment_readable, more)


# ---- the same predicates over NumPy columns (any shape; ``segment_readable`` per segment code) ----
def memory_on_segment_mask(kind: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Slots known in use that hold a memory replica on a segment (its extent is held there)."""
    return (kind == _MEMORY) & (segment >= 0)


def memory_replica_mask(status: np.ndarray, kind: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Slots in use holding a memory replica on a segment."""
    return (status != _EMPTY) & memory_on_segment_mask(kind, segment)


def memory_replica_on_mask(status: np.ndarray, kind: np.ndarray, segment: np.ndarray, code: int) -> np.ndarray:
    """Slots in use holding a memory replica on segment ``code``."""
    return (segment == code) & (kind == _MEMORY) & (status != _EMPTY)


def readable_replica_mask(status: np.ndarray, kind: np.ndarray, segment: np.ndarray,
                          segment_readable: np.ndarray) -> np.ndarray:
    """:func:`is_readable_replica` of every slot."""
    on_readable = (segment >= 0) & segment_readable[np.maximum(segment, 0)]
    return (status == _COMPLETE) & ((kind != _MEMORY) | on_readable)


def stranded_memory_replica_mask(status: np.ndarray, kind: np.ndarray, segment: np.ndarray,
                                 segment_readable: np.ndarray) -> np.ndarray:
    """Complete memory replicas that are not readable (their segment awaits its client's
    remount), pinned or not."""
    return (status == _COMPLETE) & (kind == _MEMORY) & ~readable_replica_mask(status, kind, segment, segment_readable)


def lease_expired_mask(lease_deadline: np.ndarray, now: int) -> np.ndarray:
    """:func:`lease_expired` of every deadline (a soft-pin deadline runs out the same way)."""
    return now >= lease_deadline


# The scalar predicates as plain Python, for single-key paths outside kernels (calling a jitted
# function from Python costs more than the test itself; with the JIT off it is plain already).
readable_replica = getattr(is_readable_replica, "py_func", is_readable_replica)
