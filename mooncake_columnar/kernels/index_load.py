"""Bulk loading kernels for restoring a snapshot: the key index built from many rows at once,
key refs, and allocator gaps straight from the loaded replicas.

Inserting millions of rows one by one probes the table at random: each insert is a cache and TLB
miss (about 200 ns per key at 10M keys here). The bulk build instead:

1. hashes every row (in parallel: the byte loop is the bulk of the work),
2. partitions the rows by the top bits of their home slot (a counting sort),
3. inserts partition by partition, so each partition's probes stay inside one small window of
   the table (cache resident).

Any insertion order builds a valid linear-probing table, so the table answers lookups (and
deletes) exactly like one built by ``hashing.insert_rows``; only the slot placement inside a
cluster may differ. Each insert uses ``hashing.find_or_empty_slot``, so a (tenant, key) already
present is reported instead of inserted: the build is the uniqueness check of a loaded state.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import hashing as hk

# 2^10 partitions: a partition's table window is table size / 1024 (128 KiB for 16M slots).
_PARTITION_BITS = 10


@njit(cache=True, nogil=True, parallel=True)
def _hash_rows(rows, arena, key_refs, row_tenant):
    out = np.empty(rows.shape[0], np.uint64)
    for i in prange(rows.shape[0]):
        out[i] = hk.row_hash(arena, key_refs, row_tenant, rows[i])
    return out


@njit(cache=True, nogil=True)
def _partition(rows, hashes, mask, shift, part_rows):
    """(rows, hashes) reordered by home slot >> shift (a counting sort) into ``part_rows`` (int32
    when rows fit: less memory) and a new hash array. Both are copied into partition order, not
    gathered through an index: the insert pass then reads them sequentially."""
    starts = np.zeros((mask >> shift) + 2, np.int64)
    for i in range(hashes.shape[0]):
        starts[(hk.home_slot(hashes[i], mask) >> shift) + 1] += 1
    for p in range(starts.shape[0] - 1):
        starts[p + 1] += starts[p]
    part_hashes = np.empty_like(hashes)
    for i in range(hashes.shape[0]):
        p = hk.home_slot(hashes[i], mask) >> shift
        part_rows[starts[p]] = rows[i]
        part_hashes[starts[p]] = hashes[i]
        starts[p] += 1
    return part_rows, part_hashes


@njit(cache=True, nogil=True)
def _insert_all(table, rows, hashes, arena, key_refs, row_tenant):
    """Insert each row unless its (tenant, key) is present; returns that row, or -1."""
    for i in range(rows.shape[0]):
        r = rows[i]
        ref = key_refs[r]
        existing, slot = hk.find_or_empty_slot(table, arena, key_refs, row_tenant, arena,
                                               hk.ref_offset(ref), hk.ref_length(ref), row_tenant[r],
                                               hashes[i])
        if existing >= 0:
            return r
        hk.fill_slot(table, slot, hashes[i], r)
    return -1


def bulk_insert_unique(table: np.ndarray, rows: np.ndarray, arena: np.ndarray, key_refs: np.ndarray,
                       row_tenant: np.ndarray) -> int:
    """``hashing.insert_rows_unique`` for many rows: insert ``rows`` (keys in ``arena`` via
    ``key_refs``, tenants in ``row_tenant``) into ``table``; returns the index into ``rows`` of
    a row whose (tenant, key) was already present (then the table holds an unspecified subset of
    the rows: the caller discards it), or -1."""
    rows = np.ascontiguousarray(rows, np.int64)
    if rows.size == 0:
        return -1
    mask = table.shape[0] - 1
    shift = max(0, mask.bit_length() - _PARTITION_BITS)
    part_rows = np.empty(rows.size, np.int32 if rows.max() <= np.iinfo(np.int32).max else np.int64)
    part_rows, part_hashes = _partition(rows, _hash_rows(rows, arena, key_refs, row_tenant), mask, shift,
                                        part_rows)
    dup = int(_insert_all(table, part_rows, part_hashes, arena, key_refs, row_tenant))
    return -1 if dup < 0 else int(np.flatnonzero(rows == dup)[0])


@njit(cache=True, nogil=True)
def group_by_code(codes, n_codes):
    """(order, bounds): positions of ``codes`` (in [0, n_codes)) grouped by code, stably (a
    counting sort); group c is order[bounds[c]:bounds[c + 1]]."""
    bounds = np.zeros(n_codes + 1, np.int64)
    for i in range(codes.shape[0]):
        bounds[codes[i] + 1] += 1
    for c in range(n_codes):
        bounds[c + 1] += bounds[c]
    order = np.empty(codes.shape[0], np.int64)
    fill = bounds[:-1].copy()
    for i in range(codes.shape[0]):
        order[fill[codes[i]]] = i
        fill[codes[i]] += 1
    return order, bounds


@njit(cache=True, nogil=True)
def set_key_refs(key_refs, rows, offsets, shift):
    """``key_refs[rows[i]]`` = the ref of key i, bytes [offsets[i], offsets[i + 1]) + ``shift`` of
    the arena. Returns False (refs partly written) if a length does not fit the ref's length bits."""
    limit = (1 << hk.KEY_LENGTH_BITS) - 1
    for i in range(rows.shape[0]):
        length = offsets[i + 1] - offsets[i]
        if length < 0 or length > limit:
            return False
        key_refs[rows[i]] = hk.key_ref(offsets[i] + shift, length)
    return True


@njit(cache=True, nogil=True)
def gaps_in_offset_order(seg, offsets, sizes, capacity):
    """(ok, starts, lengths, bounds, used): the free gaps of each segment between extents listed
    in increasing offset order per segment (as a bulk load and the engine's export leave them);
    segment c's gaps are starts/lengths[bounds[c]:bounds[c + 1]], ``used[c]`` its held bytes.
    ok=False when some extent is out of order, empty, overlapping or past capacity: the caller
    then takes the general path, which sorts and names the offending extent."""
    n_seg = capacity.shape[0]
    ends = np.zeros(n_seg, np.int64)
    used = np.zeros(n_seg, np.int64)
    bounds = np.zeros(n_seg + 1, np.int64)
    for i in range(seg.shape[0]):
        c, o, z = seg[i], offsets[i], sizes[i]
        if z <= 0 or o < ends[c] or o > capacity[c] - z:
            return False, ends, ends, bounds, used
        if o > ends[c]:
            bounds[c + 1] += 1
        ends[c] = o + z
        used[c] += z
    for c in range(n_seg):
        bounds[c + 1] += bounds[c] + (ends[c] < capacity[c])
    starts = np.empty(bounds[n_seg], np.int64)
    lengths = np.empty(bounds[n_seg], np.int64)
    fill = bounds[:-1].copy()
    ends[:] = 0
    for i in range(seg.shape[0]):
        c, o = seg[i], offsets[i]
        if o > ends[c]:
            starts[fill[c]] = ends[c]
            lengths[fill[c]] = o - ends[c]
            fill[c] += 1
        ends[c] = o + sizes[i]
    for c in range(n_seg):
        if ends[c] < capacity[c]:
            starts[fill[c]] = ends[c]
            lengths[fill[c]] = capacity[c] - ends[c]
    return True, starts, lengths, bounds, used
