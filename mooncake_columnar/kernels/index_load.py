"""Bulk loading kernels for restoring a snapshot: keys copied into the arena and the key index
built from many rows at once (the allocators are rebuilt by :mod:`.rebuild`).

Inserting millions of rows one by one probes the table at random: each insert is a cache and TLB
miss (about 200 ns per key at 10M keys here). The bulk build instead:

1. copies each row's key into the arena, sets its ref, hashes it while it is in cache and counts
   rows per window of the table (windows: equal ranges of home slots, ``hashing.region_of``), in
   parallel chunks: one pass over the key bytes;
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

from typing import Callable

import numpy as np
from numba import prange

from . import hashing as hk
from .jit import njit
from .nrt_free import nrt_free

# At most 1024 windows (128 KiB of table each at 16M slots), each at least 4096 slots.
_MAX_WINDOWS = 1024
_MIN_WINDOW = 4096
_BATCH_ROWS = 1 << 21  # rows per load_keys_unique batch: ~40 MB of temporaries
_BATCH_BYTES = 64 << 20  # key bytes per batch at most: the mapped pages they come from are let go after each
_CHUNKS = 16  # parallel chunks of the hash and scatter passes (stable: chunk order is row order)
_COPY_BLOCK = 1024  # keys copied, then hashed, at a time (32-byte keys: 32 KiB, still in cache)


@njit(inline="always", cache=True)
def _tag_hash(tag):
    """A hash with tag ``tag``: all the table uses of a hash (home slot, stored tag) is its tag,
    so the build keeps 32-bit tags, half the temporary memory of full hashes."""
    return np.uint64(tag) << np.uint64(hk.TAG_SHIFT)


@njit(inline="always", cache=True)
def _chunk(c, n):
    """Rows [lo, hi) of parallel chunk ``c`` of ``n``, unsigned: a loop over them indexes without
    the negative-index fix-up that keeps LLVM from vectorising it."""
    return np.uint64(c * n // _CHUNKS), np.uint64((c + 1) * n // _CHUNKS)


@njit(cache=True, nogil=True, parallel=True)
def _copy_hash_count(rows, offsets, data, arena, shift, key_refs, row_tenant, size, n_windows, tags, counts):
    """Key i (bytes [offsets[i], offsets[i + 1]) of ``data``) into the arena at offsets[i] + shift,
    ``key_refs[rows[i]]`` its ref, ``tags[i]`` its hash's tag; ``counts``: rows per (chunk,
    window). One pass over the key bytes: each block of keys is hashed while it is still in
    cache from its copy, and the arena's fresh pages fault in on every thread. Returns how many
    chunks stopped at a key whose length is negative or does not fit the ref's length bits
    (nothing of that block copied: offsets out of order never write outside the keys' span)."""
    n = rows.shape[0]
    limit = (1 << hk.KEY_LENGTH_BITS) - 1
    bad = 0
    for c in prange(_CHUNKS):
        lo, hi = _chunk(c, n)
        for b in range(lo, hi, np.uint64(_COPY_BLOCK)):
            e = min(b + np.uint64(_COPY_BLOCK), hi)
            ok = True
            for i in range(b, e):
                length = offsets[i + np.uint64(1)] - offsets[i]
                ok &= (length >= 0) & (length <= limit)
            ok &= (offsets[b] >= offsets[0]) & (offsets[e] <= offsets[n])
            if not ok:
                bad += 1
                break
            arena[offsets[b] + shift:offsets[e] + shift] = data[offsets[b]:offsets[e]]
            for i in range(b, e):
                start = offsets[i] + shift
                length = offsets[i + np.uint64(1)] - offsets[i]
                r = rows[i]
                key_refs[r] = hk.key_ref(start, length)
                tag = hk.hash_tag(hk.hash_key_inline(arena, start, length, row_tenant[r]))
                tags[i] = tag
                counts[c, hk.region_of(hk.tag_home(tag, size), size, n_windows)] += 1
    return bad


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
        lo, hi = _chunk(c, n)
        for i in range(lo, hi):
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


BAD_KEYS = -2  # load_keys_unique: a key's offsets are out of order or out of range, or it is too long


def load_keys_unique(table: np.ndarray, rows: np.ndarray, offsets: np.ndarray, data: np.ndarray,
                     arena: np.ndarray, shift: int, key_refs: np.ndarray, row_tenant: np.ndarray,
                     after_copy: Callable[[], None] = lambda: None) -> int:
    """Copy key i (bytes [offsets[i], offsets[i + 1]) of ``data``) to the arena at offsets[i] + shift,
    point ``key_refs[rows[i]]`` at it and insert ``rows`` into ``table`` (tenants in
    ``row_tenant``), as ``index_rows.insert_rows_unique`` would. Returns the index into ``rows``
    of a row whose (tenant, key) was already present (then the table holds an unspecified subset
    of the rows: the caller discards it), :data:`BAD_KEYS`, or -1. The arena must have room for
    the keys' span. Rows go in batches of at most _BATCH_ROWS rows and _BATCH_BYTES key bytes:
    the per-row temporaries stay bounded, and ``after_copy`` runs after each batch's keys are
    copied (a restore lets go of the mapped pages they were read from). A duplicate of an
    earlier batch's row is found in the table like any other present key."""
    rows = np.ascontiguousarray(rows, np.int64)
    offsets = np.ascontiguousarray(offsets, np.int64)
    n = rows.size
    if offsets.size != n + 1:
        raise ValueError("offsets must have one more entry than rows")
    if n == 0:
        return -1
    first, last = int(offsets[0]), int(offsets[-1])
    if first < 0 or last > data.size or last < first:
        return BAD_KEYS
    if first + shift < 0 or last + shift > arena.size:
        raise ValueError("the arena has no room for the keys")
    lo = 0
    while lo < n:  # (offsets out of order give odd batch ends; the kernel refuses them)
        by_bytes = int(np.searchsorted(offsets, offsets[lo] + _BATCH_BYTES, "right")) - 1
        hi = min(n, lo + _BATCH_ROWS, max(lo + 1, by_bytes))
        dup = _insert_batch(table, rows[lo:hi], offsets[lo:hi + 1], data, arena, shift, key_refs, row_tenant,
                            after_copy)
        if dup != -1:
            return dup if dup == BAD_KEYS else lo + dup
        lo = hi
    return -1


def _insert_batch(table: np.ndarray, rows: np.ndarray, offsets: np.ndarray, data: np.ndarray, arena: np.ndarray,
                  shift: int, key_refs: np.ndarray, row_tenant: np.ndarray, after_copy: Callable[[], None]) -> int:
    """:func:`load_keys_unique` for one batch of (at least one) rows."""
    size = table.shape[0]
    n_windows = max(1, min(_MAX_WINDOWS, size // _MIN_WINDOW))
    tags = np.empty(rows.size, np.uint32)
    counts = np.zeros((_CHUNKS, n_windows), np.int64)
    bad = _copy_hash_count(rows, offsets, data, arena, shift, key_refs, row_tenant, size, n_windows, tags, counts)
    after_copy()
    if bad:
        return BAD_KEYS
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
