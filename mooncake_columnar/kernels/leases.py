"""Lease grants with max-update semantics: a grant never shortens a deadline (RFC Phase 2)."""
from __future__ import annotations

import numpy as np
from numba import prange

from ..clock import INT64_MAX
from ..schema import FLAG_GROUP_REFRESH, FLAG_PENDING_SOFT_PIN, FLAG_SOFT_PIN_ENABLED
from .jit import njit
from .predicates import group_awaits_refresh, is_grouped, is_soft_pin_enabled
from .rowbits import has_bit
from .slot_index import find_slot, slot_value

_REFRESH = int(FLAG_GROUP_REFRESH)
_SOFT_ENABLED = int(FLAG_SOFT_PIN_ENABLED)
_PENDING = int(FLAG_PENDING_SOFT_PIN)


@njit(inline="always", cache=True)
def grant_until(deadlines, row, deadline):
    """GrantLeaseUntil: deadlines[row] = max(deadlines[row], deadline)."""
    if deadline > deadlines[row]:
        deadlines[row] = deadline


@njit(inline="always", cache=True)
def grant(deadlines, row, now, ttl_ns):
    """GrantLease(ttl): max-update to now + ttl."""
    grant_until(deadlines, row, now + ttl_ns)


@njit(inline="always", cache=True)
def needs_read_lease_refresh(lease_deadline, now, ttl_ns):
    """Upstream NeedsReadLeaseRefresh: less than half the TTL left."""
    return lease_deadline <= now + ttl_ns // 2


@njit(inline="always", cache=True)
def grant_read_lease(row, now, ttl_ns, lease, flags):
    """Read lease with upstream's group rule, the common part: an ungrouped object gets ttl.
    Returns True when the caller must call :func:`grant_group_read_lease` (a grouped object
    with < ttl/2 left, or whose group awaits a refresh).

    The group walk is a call of its own, made by the kernel itself: Numba keeps the reference
    counts of the arrays an inlined helper receives when that helper loops over an array or
    calls a compiled function, two atomic operations per array per key (a batch read ran 3x
    slower).
    """
    f = flags[row]
    if not is_grouped(f):
        grant(lease, row, now, ttl_ns)
        return False
    if needs_read_lease_refresh(lease[row], now, ttl_ns):
        return True
    return group_awaits_refresh(f)


@njit(cache=True)
def grant_group_read_lease(row, now, ttl_ns, lease, flags, group_links):
    """Every member of ``row``'s group (``group_links``: GroupTable.links()) gets the same
    deadline (one ``now``); the group's refresh mark is cleared."""
    deadline = now + ttl_ns
    r = row
    while True:
        grant_until(lease, r, deadline)
        flags[r] = flags[r] & ~np.uint8(_REFRESH)
        r = slot_value(group_links, r, row)
        if r == row:
            break


_CHUNKS = 64


@njit(cache=True, nogil=True, parallel=True)
def grant_recovery_masked(lease, soft, flags, bits, deadline, soft_deadline):
    """Remount recovery's assignment, one parallel pass: every object in the bitset ``bits``
    (:mod:`.rowbits`) gets the lease ``deadline`` and, when SOFT_PIN_ENABLED, the soft pin
    ``soft_deadline`` (both max-update; ``soft``: the SoftPinTable's parts())."""
    words = bits.shape[0]
    step = (words + _CHUNKS - 1) // _CHUNKS
    for c in prange(_CHUNKS):
        for w in range(c * step, min(words, (c + 1) * step)):
            word = bits[w]
            if word == 0:
                continue
            for b in range(64):
                if has_bit(word, b):
                    i = (w << 6) + b
                    grant_until(lease, i, deadline)
                    if is_soft_pin_enabled(flags[i]):
                        s = find_slot(soft[0], soft[1], i)
                        if s >= 0:
                            grant_until(soft[2], s, soft_deadline)


@njit(inline="always", cache=True)
def commit_soft_pin(flags, soft, row, now, ttl_ns):
    """Upstream CommitPendingSoftPin(ENABLE): deadline = now + ttl saturating; enabled from now on.
    ``soft``: the SoftPinTable's parts(), where the pending row took its slot at put_start."""
    s = find_slot(soft[0], soft[1], row)
    if s >= 0:
        soft[2][s] = INT64_MAX if now > INT64_MAX - ttl_ns else now + ttl_ns
    flags[row] = (flags[row] | np.uint8(_SOFT_ENABLED)) & ~np.uint8(_PENDING)
