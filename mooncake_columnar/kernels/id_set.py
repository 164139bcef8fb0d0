"""A set of positive int64 values as one array: open addressing, linear probing, deletion by
backward shift (no tombstones: probes never slow down under add/remove churn).

A table is an int64 array whose size is a power of two; EMPTY (0) marks a free slot, so members
are >= 1 (replica ids are). A value's home slot is the low bits of its splitmix64 mix
(:func:`.hashing.mix64`), so consecutive values spread over the table. The caller keeps the
load at most MAX_LOAD (:func:`capacity_for`): every probe then ends at an empty slot.
"""
from __future__ import annotations

import numpy as np

from .hashing import mix64
from .jit import njit

EMPTY = 0
TAKEN_HELD = 1   # first_taken: the value is a member and not freed
TAKEN_TWICE = 2  # first_taken: the value equals an earlier one of the same batch


@njit(cache=True)
def capacity_for(n):
    """The smallest table size (a power of two, at least 16) holding ``n`` members at a load of
    at most 3/4."""
    cap = np.int64(16)
    while 4 * n > 3 * cap:
        cap *= 2
    return cap


@njit(inline="always", cache=True)
def _home(v, mask):
    return np.int64(mix64(np.uint64(v)) & np.uint64(mask))


@njit(inline="always", cache=True)
def _slot_of(table, v):
    """(slot, True) where ``v`` is held, else (the empty slot ending its probe, False)."""
    mask = table.shape[0] - 1
    i = _home(v, mask)
    while True:
        w = table[i]
        if w == v:
            return i, True
        if w == EMPTY:
            return i, False
        i = (i + 1) & mask


@njit(inline="always", cache=True)
def _has(table, v):
    return _slot_of(table, v)[1]


_BLOCK = 32


@njit(inline="always", cache=True)
def _stage(table, values, b, heads):
    """heads[t] = the home slot's value of values[b + t], for one block: independent loads, so
    their cache misses overlap (a probe loop waits for one miss at a time). Returns the block's
    end. A kernel that writes the table re-reads a slot before trusting its head. (Removes
    gain nothing measurable from it: theirs is the apply's short list of freed ids.)"""
    mask = table.shape[0] - 1
    e = min(b + _BLOCK, values.shape[0])
    for k in range(b, e):
        heads[k - b] = table[_home(values[k], mask)]
    return e


@njit(cache=True)
def insert(table, values):
    """Add ``values`` in order; returns the index of the first one already present (the values
    before it were added, it and those after were not), or -1 when all were added."""
    mask = table.shape[0] - 1
    heads = np.empty(_BLOCK, np.int64)
    for b in range(0, values.shape[0], _BLOCK):
        for k in range(b, _stage(table, values, b, heads)):
            v = values[k]
            if heads[k - b] == EMPTY:  # the home slot was free: take it unless the block took it
                i = _home(v, mask)
                if table[i] == EMPTY:
                    table[i] = v
                    continue
            i, found = _slot_of(table, v)
            if found:
                return k
            table[i] = v
    return -1


@njit(cache=True)
def remove(table, values):
    """Remove ``values`` (absent ones are skipped); returns how many were removed."""
    mask = table.shape[0] - 1
    removed = 0
    for k in range(values.shape[0]):
        i, found = _slot_of(table, values[k])
        if not found:
            continue
        removed += 1
        j = i  # shift back the entries of the probe run after the hole that may fill it
        while True:
            j = (j + 1) & mask
            v = table[j]
            if v == EMPTY:
                break
            if ((j - _home(v, mask)) & mask) >= ((j - i) & mask):  # its home is not in (i, j]
                table[i] = v
                i = j
        table[i] = EMPTY
    return removed


@njit(cache=True)
def members(table):
    """The members, in slot order."""
    out = np.empty(table.shape[0], np.int64)
    n = 0
    for i in range(table.shape[0]):
        if table[i] != EMPTY:
            out[n] = table[i]
            n += 1
    return out[:n]


@njit(cache=True)
def first_taken(table, values, freed):
    """Could ``values`` be added once the members ``freed`` are removed? (k, TAKEN_HELD) for the
    first value that is a member not in ``freed``, (k, TAKEN_TWICE) for the first that equals
    an earlier one of ``values``, else (-1, 0). Nothing is changed: ``freed`` and the values
    seen go to small tables of their own."""
    gone = np.zeros(capacity_for(freed.shape[0]), np.int64)
    for k in range(freed.shape[0]):
        i, found = _slot_of(gone, freed[k])
        if not found:
            gone[i] = freed[k]
    seen = np.zeros(capacity_for(values.shape[0]), np.int64)
    heads = np.empty(_BLOCK, np.int64)
    for b in range(0, values.shape[0], _BLOCK):
        for k in range(b, _stage(table, values, b, heads)):
            v = values[k]
            i, found = _slot_of(seen, v)
            if found:
                return k, TAKEN_TWICE
            seen[i] = v
            h = heads[k - b]  # exact: this kernel does not write the table
            if h != EMPTY and (h == v or _has(table, v)) and not _has(gone, v):
                return k, TAKEN_HELD
    return -1, 0
