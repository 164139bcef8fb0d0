"""Open-addressing index from a row to the side-table slot it owns (linear probing).

A side table (the in-flight puts, store/inflight.py) names each in-use slot's owner row in
``owner``; the index holds slots only (-1: empty) and compares a probed slot's owner with the
row sought, so it costs 4 bytes per entry and no key copy. Its size is a power of two at most
half full; deletion shifts the probe run back (no tombstones), so it must run while the slot
still names its owner.
"""
from __future__ import annotations

import numpy as np
from .jit import njit
from .nrt_free import nrt_free

_FIB = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads the near-sequential rows


@njit(inline="always", cache=True)
def home(row, mask):
    return np.int64((np.uint64(row) * _FIB) >> np.uint64(32)) & mask


@njit(inline="always", cache=True)
def find_slot(index, owner, row):
    """The slot ``row`` owns, or -1."""
    mask = index.shape[0] - 1
    h = home(row, mask)
    while True:
        s = index[h]
        if s < 0:
            return -1
        if owner[s] == row:
            return np.int64(s)
        h = (h + 1) & mask


@njit(cache=True)
def find_slots(index, owner, rows, out):
    """``out[i]``: the slot ``rows[i]`` owns, or -1."""
    for i in range(rows.shape[0]):
        out[i] = find_slot(index, owner, rows[i])


@nrt_free  # allocates nothing: no reference per array argument to allocate at each call
def insert_slots(index, owner, slots):
    """Index ``slots`` (in use, owners set, not yet indexed); the index has room."""
    mask = index.shape[0] - 1
    for i in range(slots.shape[0]):
        h = home(owner[slots[i]], mask)
        while index[h] >= 0:
            h = (h + 1) & mask
        index[h] = slots[i]


@nrt_free
def remove_slots(index, owner, slots):
    """Drop indexed ``slots`` (their owners still set), shifting each probe run back."""
    mask = index.shape[0] - 1
    for i in range(slots.shape[0]):
        row = owner[slots[i]]
        p = home(row, mask)
        while index[p] != slots[i]:
            p = (p + 1) & mask
        j = p
        while True:
            j = (j + 1) & mask
            s = index[j]
            if s < 0:
                break
            k = home(owner[s], mask)
            # s may move back to p when its home does not lie in (p, j] (cyclically)
            if (p < j and (k <= p or k > j)) or (p > j and k <= p and k > j):
                index[p] = s
                p = j
        index[p] = -1


@njit(inline="always", cache=True)
def slot_value(parts, row, default):
    """The value ``row`` holds in a side table given as (index, owner rows, values); ``default``
    when it holds no slot."""
    s = find_slot(parts[0], parts[1], row)
    if s < 0:
        return default
    return parts[2][s]


def index_size(slots: int) -> int:
    """Index entries for a table of ``slots`` slots: a power of two, at most half full."""
    return 1 << max(3, (2 * max(slots, 1) - 1).bit_length())
