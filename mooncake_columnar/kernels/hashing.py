"""Key hashing and open-addressing probing over an int32 slot table.

Slots hold object rows (EMPTY = -1, TOMBSTONE = -2). A hit is verified against the key bytes in
the arena (length, tenant and bytes), so the table stores no hashes: 4 bytes per slot.
"""
from __future__ import annotations

import numpy as np
from numba import njit

EMPTY_SLOT = -1
TOMBSTONE = -2

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(inline="always", cache=True)
def _mix64(h):
    # splitmix64 finalizer: spreads FNV's weak low bits over the whole word
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@njit(cache=True)
def hash_key(data, start, length, tenant):
    """Hash of (tenant code, key bytes data[start:start+length])."""
    h = _FNV_OFFSET ^ np.uint64(tenant & 0xFFFFFFFF)
    for i in range(start, start + length):
        h = (h ^ np.uint64(data[i])) * _FNV_PRIME
    return _mix64(h)


@njit(inline="always", cache=True)
def _key_equals(arena, row_offset, row_length, data, start, length):
    if row_length != length:
        return False
    for i in range(length):
        if arena[row_offset + i] != data[start + i]:
            return False
    return True


@njit(cache=True)
def find_row(table, arena, key_offset, key_length, row_tenant, data, start, length, tenant, h):
    """Row of (tenant, key) or -1."""
    mask = table.shape[0] - 1
    i = np.int64(h & np.uint64(mask))
    while True:
        r = table[i]
        if r == EMPTY_SLOT:
            return -1
        if r >= 0 and row_tenant[r] == tenant and _key_equals(arena, key_offset[r], key_length[r],
                                                             data, start, length):
            return r
        i = (i + 1) & mask


@njit(cache=True)
def insert_row(table, row, h):
    """Insert ``row`` (caller guarantees the key is absent); returns True if a tombstone was reused."""
    mask = table.shape[0] - 1
    i = np.int64(h & np.uint64(mask))
    while True:
        r = table[i]
        if r < 0:
            table[i] = row
            return r == TOMBSTONE
        i = (i + 1) & mask


@njit(cache=True)
def delete_row(table, row, h):
    mask = table.shape[0] - 1
    i = np.int64(h & np.uint64(mask))
    while True:
        r = table[i]
        if r == row:
            table[i] = TOMBSTONE
            return True
        if r == EMPTY_SLOT:
            return False
        i = (i + 1) & mask


@njit(cache=True)
def row_hash(arena, key_offset, key_length, row_tenant, row):
    return hash_key(arena, key_offset[row], key_length[row], row_tenant[row])


@njit(cache=True)
def hash_batch(offsets, data, tenants):
    n = offsets.shape[0] - 1
    out = np.empty(n, np.uint64)
    for i in range(n):
        out[i] = hash_key(data, offsets[i], offsets[i + 1] - offsets[i], tenants[i])
    return out


@njit(cache=True)
def find_rows(table, arena, key_offset, key_length, row_tenant, offsets, data, tenants):
    """Rows of a batch of keys (-1 for absent)."""
    n = offsets.shape[0] - 1
    out = np.empty(n, np.int64)
    for i in range(n):
        s = offsets[i]
        ln = offsets[i + 1] - s
        h = hash_key(data, s, ln, tenants[i])
        out[i] = find_row(table, arena, key_offset, key_length, row_tenant, data, s, ln, tenants[i], h)
    return out


@njit(cache=True)
def insert_rows(table, rows, arena, key_offset, key_length, row_tenant):
    """Insert many rows; returns how many tombstones were reused."""
    reused = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        if insert_row(table, r, row_hash(arena, key_offset, key_length, row_tenant, r)):
            reused += 1
    return reused


@njit(cache=True)
def delete_rows(table, rows, arena, key_offset, key_length, row_tenant):
    for i in range(rows.shape[0]):
        r = rows[i]
        delete_row(table, r, row_hash(arena, key_offset, key_length, row_tenant, r))
