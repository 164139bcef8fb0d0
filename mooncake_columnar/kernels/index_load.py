"""Bulk loading kernels for restoring a snapshot: the key index built from many rows at once,
and key refs (the allocators are rebuilt by :mod:`.rebuild`).

Inserting millions of rows one by one probes the table at random: each insert is a cache and TLB
miss (about 200 ns per key at 10M keys here). The bulk build instead:

1. hashes every row and counts rows per window of the table (windows: equal ranges of home
   slots, ``hashing.region_of``), in parallel chunks;
2. scatters (row, hash) into window order (a counting sort, each chunk writing its own ranges:
   parallel and stable);
3. inserts window by window, windows in parallel: a window's probes stay inside its own slots
   (cache resident, and no other thread writes there). A probe that would run past its window's
   end is deferred and inserted afterwards, serially, with an unbounded probe.

Linear probing without deletes accepts any insertion order (each row lands in the first empty slot
of its probe run at insert time), so the table answers lookups (and deletes) exactly like one built
by ``index_rows.insert_rows_unique``; only the slot placement inside a cluster may differ. Every insert
checks for its (tenant, key) first: equal keys share a home slot, hence a window (or both are
deferred), so a (tenant, key) already present is reported instead of inserted: the build is the
uniqueness check of a loaded state.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import hashing as hk
from .jit import njit
from .nrt_free import nrt_free

# At most 1024 windows (128 KiB of table each at 16M slots), each at least 4096 slots.
_MAX_WINDOWS = 1024
_MIN_WINDOW = 4096
_BATCH_ROWS = 1 << 21  # rows per bulk_insert_unique batch: ~40 MB of temporaries
_CHUNKS = 16  # parallel chunks of the hash and scatter passes (stable: chunk order is row order)


@njit(inline="always", cache=True)
def _tag_hash(tag):
    """A hash with tag ``tag``: all the table uses of a hash (home slot, stored tag) is its tag,
    so the build keeps 32-bit tags, half the temporary memory of full hashes."""
    return np.uint64(tag) << np.uint64(hk.TAG_SHIFT)


@njit(cache=True, nogil=True, parallel=True)
def _hash_and_count(rows, arena, key_refs, row_tenant, size, n_windows):
    """(tag of each row's hash, rows per (chunk, window))."""
    n = rows.shape[0]
    tags = np.empty(n, np.uint32)
    counts = np.zeros((_CHUNKS, n_windows), np.int64)
    for c in prange(_CHUNKS):
        for i in range(c * n // _CHUNKS, (c + 1) * n // _CHUNKS):
            r = rows[i]
            ref = key_refs[r]
            tag = hk.hash_tag(hk.hash_key_inline(arena, hk.ref_offset(ref), hk.ref_length(ref), row_tenant[r]))
            tags[i] = tag
            counts[c, hk.region_of(hk.tag_home(tag, size), size, n_windows)] += 1
    return tags, counts


@njit(cache=True, nogil=True, parallel=True)
def _scatter(rows, tags, counts, size, part_rows, part_tags):
    """(rows, tags) into window order; returns the window bounds. Chunk c's rows of window w
    go to their own range (windows in order, chunks in order inside a window)."""
    n_windows = counts.shape[1]
    starts = np.empty_like(counts)
    bounds = np.empty(n_windows + 1, np.int64)
    at = 0
    for w in range(n_windows):
        bounds[w] = at
        for c in range(_CHUNKS):
            starts[c, w] = at
            at += counts[c, w]
    bounds[n_windows] = at
    n = rows.shape[0]
    for c in prange(_CHUNKS):
        fill = starts[c]
        for i in range(c * n // _CHUNKS, (c + 1) * n // _CHUNKS):
            w = hk.region_of(hk.tag_home(tags[i], size), size, n_windows)
            part_rows[fill[w]] = rows[i]
            part_tags[fill[w]] = tags[i]
            fill[w] += 1
    return bounds


@njit(inline="always", cache=True)
def _empty_or_tag_match(table, h, stop):
    """(slot, tag matched): the first slot of ``h``'s probe that is empty or holds its tag;
    (-1, False) if the probe steps onto ``stop`` first. Reads only the table."""
    size = table.shape[0]
    i = hk.home_slot(h, size)
    while True:
        v = table[i]
        if v == hk.EMPTY_SLOT:
            return i, False
        if hk.same_tag(v, h):
            return i, True
        i = hk.next_slot(i, size)
        if i == stop:
            return -1, False


@njit(inline="always", cache=True)
def _insert(table, r, tag, arena, key_refs, row_tenant, stop):
    """Insert row ``r`` unless its (tenant, key) is present: 1 inserted, 0 present, -1 deferred
    (the probe reached ``stop``). The row's key and tenant are read only when a slot holds its
    tag (rare): the usual insert touches the table window alone, no random row loads."""
    h = _tag_hash(tag)
    slot, matched = _empty_or_tag_match(table, h, stop)
    if matched:
        ref = key_refs[r]
        existing, slot = hk.probe_until(table, arena, key_refs, row_tenant, arena, hk.ref_offset(ref),
                                        hk.ref_length(ref), row_tenant[r], h, stop)
        if existing >= 0:
            return 0
    if slot < 0:
        return -1
    hk.fill_slot(table, slot, h, r)
    return 1


@njit(cache=True, nogil=True, parallel=True)
def _insert_windows(table, part_rows, part_tags, bounds, arena, key_refs, row_tenant, deferred):
    """Windows in parallel; marks deferred rows. Returns a row already present per window (-1)."""
    n_windows = bounds.shape[0] - 1
    dup = np.full(n_windows, -1, np.int64)
    for w in prange(n_windows):
        stop = hk.region_start(w + 1, table.shape[0], n_windows)
        for i in range(bounds[w], bounds[w + 1]):
            done = _insert(table, part_rows[i], part_tags[i], arena, key_refs, row_tenant, stop)
            if done == 0:
                dup[w] = part_rows[i]
                break
            deferred[i] = done < 0
    return dup


@nrt_free
def _insert_deferred(table, part_rows, part_tags, deferred, arena, key_refs, row_tenant):
    """The deferred rows, in window order, with unbounded probes; a row already present, or -1."""
    for i in range(part_rows.shape[0]):
        if deferred[i]:
            if _insert(table, part_rows[i], part_tags[i], arena, key_refs, row_tenant, -1) == 0:
                return part_rows[i]
    return -1


def bulk_insert_unique(table: np.ndarray, rows: np.ndarray, arena: np.ndarray, key_refs: np.ndarray,
                       row_tenant: np.ndarray) -> int:
    """``index_rows.insert_rows_unique`` for many rows: insert ``rows`` (keys in ``arena`` via
    ``key_refs``, tenants in ``row_tenant``) into ``table``; returns the index into ``rows`` of
    a row whose (tenant, key) was already present (then the table holds an unspecified subset of
    the rows: the caller discards it), or -1. Rows go in batches of _BATCH_ROWS: the
    per-row temporaries stay bounded (a duplicate of an earlier batch's row is found in the
    table like any other present key)."""
    rows = np.ascontiguousarray(rows, np.int64)
    for lo in range(0, rows.size, _BATCH_ROWS):
        dup = _insert_batch(table, rows[lo:lo + _BATCH_ROWS], arena, key_refs, row_tenant)
        if dup >= 0:
            return lo + dup
    return -1


def _insert_batch(table: np.ndarray, rows: np.ndarray, arena: np.ndarray, key_refs: np.ndarray,
                  row_tenant: np.ndarray) -> int:
    """:func:`bulk_insert_unique` for one batch of (at least one) rows."""
    size = table.shape[0]
    n_windows = max(1, min(_MAX_WINDOWS, size // _MIN_WINDOW))
    tags, counts = _hash_and_count(rows, arena, key_refs, row_tenant, size, n_windows)
    part_rows = np.empty(rows.size, np.int32 if rows.max() <= np.iinfo(np.int32).max else np.int64)
    part_tags = np.empty_like(tags)
    bounds = _scatter(rows, tags, counts, size, part_rows, part_tags)
    del tags
    deferred = np.zeros(rows.size, np.bool_)
    dups = _insert_windows(table, part_rows, part_tags, bounds, arena, key_refs, row_tenant, deferred)
    dup = int(dups.max())
    if dup < 0:
        dup = int(_insert_deferred(table, part_rows, part_tags, deferred, arena, key_refs, row_tenant))
    return -1 if dup < 0 else int(np.flatnonzero(rows == dup)[0])


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
