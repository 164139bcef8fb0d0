"""Lease grants with max-update semantics: a grant never shortens a deadline (RFC Phase 2)."""
from __future__ import annotations

import numpy as np
from numba import njit

from ..schema import FLAG_GROUP_REFRESH, FLAG_PENDING_SOFT_PIN, FLAG_SOFT_PIN_ENABLED, INT64_MAX
from .predicates import group_awaits_refresh, is_grouped, is_soft_pin_enabled

_REFRESH = int(FLAG_GROUP_REFRESH)
_SOFT_ENABLED = int(FLAG_SOFT_PIN_ENABLED)
_PENDING = int(FLAG_PENDING_SOFT_PIN)
_I64_MAX = int(INT64_MAX)


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


@njit(cache=True)
def grant_read_lease(row, now, ttl_ns, lease, flags, group_next):
    """Read lease with upstream's group rule.

    Ungrouped: grant ttl. Grouped: only when < ttl/2 remains or the group awaits a refresh,
    and then every member of the group gets the same deadline (one ``now``).
    """
    f = flags[row]
    if not is_grouped(f):
        grant(lease, row, now, ttl_ns)
        return
    if not needs_read_lease_refresh(lease[row], now, ttl_ns) and not group_awaits_refresh(f):
        return
    deadline = now + ttl_ns
    r = row
    while True:
        grant_until(lease, r, deadline)
        flags[r] = flags[r] & ~np.uint8(_REFRESH)
        r = group_next[r]
        if r == row:
            break


@njit(cache=True, nogil=True)
def grant_until_masked(deadlines, mask, deadline):
    """Masked max-update of many rows to one deadline (remount recovery, batch reads)."""
    for i in range(deadlines.shape[0]):
        keep = deadlines[i]  # select form (always store): branch-free, vectorizes
        deadlines[i] = deadline if mask[i] and deadline > keep else keep


@njit(cache=True, nogil=True)
def grant_soft_pin_masked(soft_deadlines, flags, mask, deadline):
    """Remount: SOFT_PIN_ENABLED objects in ``mask`` get the full soft-pin TTL (max-update)."""
    for i in range(soft_deadlines.shape[0]):
        keep = soft_deadlines[i]  # select form (always store): branch-free, vectorizes
        take = mask[i] and is_soft_pin_enabled(flags[i]) and deadline > keep
        soft_deadlines[i] = deadline if take else keep


@njit(cache=True)
def grant_rows(deadlines, rows, deadline):
    """Max-update the listed rows to one deadline (negative rows are skipped)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if r >= 0 and deadline > deadlines[r]:
            deadlines[r] = deadline


@njit(inline="always", cache=True)
def commit_soft_pin(flags, soft_deadline, row, now, ttl_ns):
    """Upstream CommitPendingSoftPin(ENABLE): deadline = now + ttl saturating; enabled from now on."""
    soft_deadline[row] = _I64_MAX if now > _I64_MAX - ttl_ns else now + ttl_ns
    flags[row] = (flags[row] | np.uint8(_SOFT_ENABLED)) & ~np.uint8(_PENDING)
